"""Every TURINGBOX_* name in the shipped code is a declared setting (flag + variable, resolved once), or one of
the few documented below that are not the appliance's settings. A new ad hoc variable fails here."""
from __future__ import annotations

import importlib
import os
import re
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DECLARING = ("turingbox.plan.command", "turingbox.serve.options", "turingbox.model.demo",
             "turingbox.cache.store", "turingbox.serve.warmup_command")

NOT_APPLIANCE_SETTINGS = {
    # the plugin's own, read in vLLM's worker processes (the plugin imports nothing of the appliance); the
    # appliance hands resolved values on through --additional-config, and these pass through its environment
    "TURINGBOX_PLUGIN": "the plugin's on/off switch in a plain vLLM environment",
    "TURINGBOX_GDN_LIB": "the plugin's prebuilt sm_75 GDN library (set by the image)",
    "TURINGBOX_PRUNE_AUTOTUNE": "the plugin's autotune pruning switch",
    "TURINGBOX_BENCH_URL": "the plugin's bench tools' default URL",
    # build and development tools, never read by `turingbox serve`
    "TURINGBOX_VLLM_SRC": "vLLM's source for the AOT spec derivations and compile checks",
    "TURINGBOX_FLASHINFER_SRC": "FlashInfer's source for its module derivation",
    "TURINGBOX_CUDA_EXTRA_INCLUDE": "extra CUDA headers for the FlashInfer ahead-of-time build",
    "TURINGBOX_CACHE_VOLUME": "the Docker volume `make warmup-cache` seeds",
    "TURINGBOX_VERSION": "the image's label, set at build",
    # compose's own interpolation variables (docker compose reads them, not the appliance)
    "TURINGBOX_IMAGE": "compose: the image tag",
    "TURINGBOX_BIND_ADDRESS": "compose: the host address the port is published on",
    "TURINGBOX_GPU_COUNT": "compose: how many GPUs the service reserves",
}


def names_in_shipped_files() -> dict[str, set[str]]:
    files = subprocess.run(["git", "ls-files", "entrypoint", "plugin", "Dockerfile", "compose.yaml", "deploy"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found: dict[str, set[str]] = {}
    for rel in files:
        if not rel.endswith((".py", ".sh", ".yaml", ".yml", "Dockerfile")):
            continue
        with open(os.path.join(REPO, rel), errors="replace") as f:
            for m in re.finditer(r"TURINGBOX_[A-Z0-9_]+", f.read()):
                found.setdefault(m.group(0), set()).add(rel)
    return found


def test_every_turingbox_variable_is_a_setting_or_documented():
    for module in DECLARING:
        importlib.import_module(module)
    from turingbox.settings import REGISTRY
    declared = {s.env_name for s in REGISTRY.values()}
    found = names_in_shipped_files()
    unknown = {n: sorted(f) for n, f in found.items() if n not in declared and n not in NOT_APPLIANCE_SETTINGS}
    assert not unknown, f"TURINGBOX_* names that are neither declared settings nor documented exceptions: {unknown}"
    stale = sorted(set(NOT_APPLIANCE_SETTINGS) - set(found))
    assert not stale, f"documented exceptions no longer used: {stale}"
    assert not set(NOT_APPLIANCE_SETTINGS) & declared, "a declared setting is also listed as an exception"
