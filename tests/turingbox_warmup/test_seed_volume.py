"""make warmup-cache: container arguments, environment passthrough and log-driven progress."""
import json

from turingbox_warmup import seed_volume
from turingbox_warmup.seed_protocol import RESULT_PREFIX, STAGES


def test_container_gets_all_gpus_the_volume_and_the_compose_environment():
    kw = seed_volume.container_kwargs("turingbox:0.1.0", "turingbox_cache",
                                      {"TURINGBOX_MODEL": "/models/x", "TURINGBOX_CACHE_DIR": "/elsewhere",
                                       "HOME": "/root", "AWS_SECRET": "no"})
    assert kw["command"] == ["turingbox", "warmup", "--seed-only"]
    assert kw["environment"] == {"TURINGBOX_MODEL": "/models/x", "TURINGBOX_CACHE_DIR": "/cache"}
    assert kw["volumes"] == {"turingbox_cache": {"bind": "/cache", "mode": "rw"}}
    req = kw["device_requests"][0]
    assert req["Count"] == -1 and req["Capabilities"] == [["gpu"]]


def test_progress_follows_stage_lines_split_across_chunks():
    result = {"cache_key": "abcd", "result": "miss", "mode": "shared", "gpu_name": "NVIDIA H200",
              "tensor_parallel_size": 1, "num_speculative_tokens": 3,
              "sizes": {"triton": {"files": 10, "bytes": 3 * 2**20}, "vllm": {"files": 2, "bytes": 2**20}}}
    log = "".join([f"turingbox-stage: {s}\nINFO some vllm line\n" for s in STAGES])
    log += RESULT_PREFIX + json.dumps(result) + "\n"
    raw = log.encode()
    chunks = [raw[i:i + 7] for i in range(0, len(raw), 7)]  # arbitrary byte boundaries
    progress = seed_volume.Progress()
    advanced = [progress.feed(line) for line in seed_volume.split_lines(chunks)]
    assert sum(advanced) == len(STAGES) and progress.stage_name == "complete"
    assert progress.result == result
    text = seed_volume.summary(progress.result)
    assert "cache_key abcd" in text and "total 4.0 MiB" in text and "MTP 3" in text


def test_stage_lines_never_go_backwards_and_unknown_ones_are_ignored():
    p = seed_volume.Progress()
    assert p.feed("turingbox-stage: engine-ready")
    assert not p.feed("turingbox-stage: plan")
    assert not p.feed("turingbox-stage: bogus")
    assert p.stage_name == "engine-ready"


def test_a_seed_with_a_second_start_holds_at_loading_start_until_complete():
    """The seed's real sequence when its first start compiled: the engine stages twice (tests/turingbox/cache/test_seed_e2e.py)."""
    engine = ["engine-start", "engine-ready", "strict-warmup", "active-warmup", "engine-stop"]
    progress = seed_volume.Progress()
    names = []
    for stage in ["plan", "cache", *engine, "loading-start", *engine]:
        progress.feed(f"turingbox-stage: {stage}")
        names.append(progress.stage_name)
    assert names[-6:] == ["loading-start"] * 6                   # the second start's stages do not move it back
    assert progress.feed("turingbox-stage: complete") and progress.stage_name == "complete"
