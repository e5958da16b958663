"""The seed's progress protocol (turingbox_warmup.seed_protocol): what `turingbox warmup` writes is what
`make warmup-cache` reads back."""
import pytest

from turingbox_warmup.seed_protocol import STAGES, is_result, result_line, result_of, stage_line, stage_of


def test_every_stage_line_reads_back_as_its_stage():
    for name in STAGES:
        assert stage_of(stage_line(name)) == name
        assert stage_of(stage_line(name, "entry already complete; nothing to do")) == name
    assert stage_line("complete") == "turingbox-stage: complete"
    assert stage_line("plan", "x y") == "turingbox-stage: plan x y"


def test_a_stage_outside_the_protocol_is_refused_when_written_and_ignored_when_read():
    with pytest.raises(AssertionError):
        stage_line("compiling")
    assert stage_of("turingbox-stage: compiling") is None
    assert stage_of("INFO turingbox-stage: plan") is None        # only at the start of a line


def test_the_result_line_reads_back_as_the_same_object():
    result = {"cache_key": "abcd", "sizes": {"triton": {"files": 1, "bytes": 2}}, "mode": "shared"}
    line = result_line(result)
    assert line.startswith("turingbox-seed-result: {") and is_result(line)
    assert result_of(line) == result
    assert stage_of(line) is None
    assert result_of("turingbox-seed-result: {\"cut") is None and is_result("turingbox-seed-result: {\"cut")
    assert result_of(stage_line("complete")) is None and not is_result(stage_line("complete"))
