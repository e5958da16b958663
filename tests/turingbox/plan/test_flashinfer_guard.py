"""The planner refuses FLASHINFER on sm_75 with a FlashInfer whose head_dim-256 prefill overflows 64 KiB.

FlashInfer 0.6.10 .. 0.6.15 pad SharedStorageQKVO with NVFP4/repack placeholders for every KV dtype
(flashinfer-ai/flashinfer#3528, fixed in 0.6.16 by #3526); 0.6.8.post1 (the image's pin) and 0.6.9 do not
(tests/turingbox_warmup/image/test_flashinfer_aot.py measures sizeof(SharedStorage) of the pinned headers: exactly 65,536 B).
Fake inventories, the real Qwen3.6-27B architecture (head_dim 256).
"""
from __future__ import annotations

import copy
import json

import pytest

from turingbox.errors import PlanError
from turingbox.gpus.inventory import read_inventory
from turingbox.plan import from_settings as plan_command
from turingbox.plan.planner import flashinfer_sm75_problem, make_plan
from tests.support.plan_factory import plan_settings
from turingbox_plugin.model_config import load_model_config

from tests.turingbox.plan.test_planner import FIXTURES, SOFTWARE, write_model  # noqa: E402


def software(flashinfer: str) -> dict:
    return {**SOFTWARE, "flashinfer-python": flashinfer}


@pytest.fixture(scope="module")
def awq_model(tmp_path_factory):
    return load_model_config(write_model(tmp_path_factory.mktemp("m"), "qwen-awq", awq=True))


@pytest.fixture(scope="module")
def small_head_model(tmp_path_factory):
    root = tmp_path_factory.mktemp("m64")
    path = write_model(root, "qwen-hd64", awq=True)
    cfg = json.loads((root / "qwen-hd64" / "config.json").read_text())
    cfg["text_config"]["head_dim"] = 64
    (root / "qwen-hd64" / "config.json").write_text(json.dumps(cfg))
    return load_model_config(path)


def inv(name: str):
    return read_inventory(str(FIXTURES / f"{name}.json"), {})


BROKEN = ["0.6.10", "0.6.11.post3", "0.6.12", "0.6.13", "0.6.15.post1"]
FINE = ["0.6.8", "0.6.8.post1", "0.6.9", "0.6.16", "0.6.16.post4", "0.7.4", "absent"]


@pytest.mark.parametrize("version", BROKEN)
@pytest.mark.parametrize("fixture", ["2x2080ti-22g", "4x2080ti-22g", "8x2080ti-22g"])
def test_sm75_flashinfer_refused_for_broken_versions(awq_model, fixture, version):
    with pytest.raises(PlanError) as err:
        make_plan(inv(fixture), awq_model, plan_settings({}), software(version))
    text = str(err.value)
    assert f"flashinfer-python {version}" in text and "0.6.16" in text and "#3528" in text and "#3526" in text
    assert "65,536" in text and "head_dim-256" in text and "\n" not in text
    # the remedy names the pin and the other backend, with the settings to set
    assert "0.6.8.post1" in text and "TURINGBOX_ATTENTION_BACKEND=TRITON_ATTN" in text


@pytest.mark.parametrize("version", FINE)
def test_sm75_flashinfer_planned_for_good_versions(awq_model, version):
    plan = make_plan(inv("2x2080ti-22g"), awq_model, plan_settings({}), software(version))
    assert plan.attention_backend == "FLASHINFER" and plan.compute_capability == "7.5"
    assert plan.cache_inputs["software"]["flashinfer-python"] == version


def test_explicit_flashinfer_override_is_refused_too(awq_model):
    with pytest.raises(PlanError, match="flashinfer-python 0.6.13"):
        make_plan(inv("2x2080ti-22g"), awq_model, plan_settings({"attention_backend": "FLASHINFER"}), software("0.6.13"))


def test_other_backend_on_sm75_is_not_affected(awq_model):
    plan = make_plan(inv("2x2080ti-22g"), awq_model, plan_settings({"attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8_e5m2"}),
                     software("0.6.13"))
    assert plan.attention_backend == "TRITON_ATTN"


def test_other_archs_with_flashinfer_are_not_affected(awq_model, tmp_path):
    # sm_86 plans FLASHINFER by default; its opt-in limit is 99 KiB, the padded struct fits there.
    gpus = [{"index": 0, "uuid": "GPU-3090-0", "name": "NVIDIA GeForce RTX 3090", "compute_capability": "8.6",
             "memory_total_mib": 24576, "memory_free_mib": 24000, "pci_bus_id": "00000000:01:00.0"}]
    path = tmp_path / "3090.json"
    path.write_text(json.dumps(gpus))
    plan = make_plan(read_inventory(str(path), {}), awq_model, plan_settings(), software("0.6.13"))
    assert plan.attention_backend == "FLASHINFER" and plan.compute_capability == "8.6"
    h200 = make_plan(inv("1xh200"), awq_model, plan_settings({"attention_backend": "FLASHINFER", "dtype": "bfloat16"}),
                     software("0.6.13"))
    assert h200.attention_backend == "FLASHINFER"


def test_small_head_dim_is_not_affected(small_head_model):
    # head_dim 64: two CTAs per SM halve the per-block budget, so the padded struct stays far below 64 KiB.
    plan = make_plan(inv("2x2080ti-22g"), small_head_model, plan_settings({}), software("0.6.13"))
    assert plan.attention_backend == "FLASHINFER"


def test_guard_function_boundaries():
    assert flashinfer_sm75_problem(75, "FLASHINFER", 256, {"flashinfer-python": "0.6.9"}) is None
    assert flashinfer_sm75_problem(75, "FLASHINFER", 256, {"flashinfer-python": "0.6.10"})
    assert flashinfer_sm75_problem(75, "FLASHINFER", 128, {"flashinfer-python": "0.6.12"})   # flashinfer#3620
    assert flashinfer_sm75_problem(75, "FLASHINFER", 256, {"flashinfer-python": "0.6.16"}) is None
    assert flashinfer_sm75_problem(75, "FLASHINFER", 256, {"flashinfer-python": "garbage"}) is None
    assert flashinfer_sm75_problem(86, "FLASHINFER", 256, {"flashinfer-python": "0.6.12"}) is None
    assert flashinfer_sm75_problem(75, "TRITON_ATTN", 256, {"flashinfer-python": "0.6.12"}) is None


def test_turingbox_plan_demo_refusal_names_the_versions(monkeypatch, capsys):
    # The command layer (demo model, software read from package metadata) ends in the same sentence, exit 2.
    import turingbox.cli as cli
    monkeypatch.setattr(plan_command, "_software", lambda: software("0.6.14"))
    rc = cli.main(["plan", "--gpus-json", str(FIXTURES / "4x2080ti-22g.json"), "--json"])
    err = capsys.readouterr().err
    assert rc == 2 and "flashinfer-python 0.6.14" in err and "#3528" in err and "Traceback" not in err
    monkeypatch.setattr(plan_command, "_software", lambda: software("0.6.8.post1"))
    assert cli.main(["plan", "--gpus-json", str(FIXTURES / "4x2080ti-22g.json"), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["attention_backend"] == "FLASHINFER" and copy.deepcopy(plan["cache_inputs"])   # the printed JSON
