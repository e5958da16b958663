"""compose.yaml passes every user-facing setting through; the rest are fixed by the image on purpose."""
from pathlib import Path

from turingbox import config

REPO = Path(__file__).resolve().parents[2]

# Set by the image or only meaningful for tests and tooling, so compose does not pass them through.
IMAGE_INTERNAL = {
    "TURINGBOX_CACHE_DIR", "TURINGBOX_MODELS_DIR", "TURINGBOX_BAKED_CACHE_DIR", "TURINGBOX_AOT_TRITON_DIR",
    "TURINGBOX_AOT_FLASHINFER_DIR", "TURINGBOX_AOT_MODELINFOS_DIR",  # image paths
    "TURINGBOX_HOST", "TURINGBOX_UPSTREAM_PORT", "TURINGBOX_RUNTIME_DIR",  # the container's own network and tmp
    "TURINGBOX_GPUS_JSON", "TURINGBOX_VLLM_COMMAND", "TURINGBOX_PLAN_FILE",  # simulation and tests
    "TURINGBOX_CACHE_LOCK_WAIT", "TURINGBOX_EXIT_LINGER_SECONDS", "TURINGBOX_UPSTREAM_PROBE_SECONDS",  # tuning
}


def test_every_user_facing_setting_reaches_the_container():
    compose = (REPO / "compose.yaml").read_text()
    names = {s.env_name for s in config.REGISTRY.values()}
    missing = sorted(n for n in names - IMAGE_INTERNAL if f"- {n}" not in compose and f"{n}=" not in compose)
    assert not missing, f"compose.yaml does not pass through: {missing}"
    assert IMAGE_INTERNAL <= names, f"stale names in IMAGE_INTERNAL: {sorted(IMAGE_INTERNAL - names)}"
