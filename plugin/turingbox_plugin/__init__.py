"""turingbox vLLM general plugin.

vLLM calls `register()` (entry point group `vllm.general_plugins`) once per process: the API
server, the engine core and every worker. It must be cheap, re-entrant and must not touch CUDA;
all real work happens in the worker class `turingbox_plugin.worker.TuringboxWorker`, which the plan
selects with `--worker-cls`. With `VLLM_PLUGINS=''` vLLM never imports this module at all
(`vllm.plugins.load_plugins_by_group` only loads names listed in VLLM_PLUGINS when it is set).

Why register() sets TRITON_CACHE_AUTOTUNING at all, when vLLM's `env_override.py` already does
`os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")` at `import vllm`:
  * Triton's `Autotuner.__init__` snapshots `knobs.autotuning.cache` when the decorated module is
    imported (`self.cache_results = (cache_results or knobs.autotuning.cache) ...`), so the value
    must be in the environment before any `@triton.autotune` module (FLA's GDN ops) is imported.
    vLLM's setdefault satisfies that only in processes that import `vllm` first; the worker also
    re-evaluates the flag at tuning time (turingbox_plugin.autotune), which removes the ordering
    hazard entirely.
  * The 93 s re-tuning seen on warm restarts has a second cause that no env default fixes: the
    disk entry lives under TRITON_CACHE_DIR *as it is when tuning runs*. A cold start compiles the
    model and `compiler_interface.InductorAdaptor.initialize_cache` redirects TRITON_CACHE_DIR into
    the compile cache (`<cache>/triton_cache`), so the timings are written there; a warm start with
    the AOT artifact (VLLM_USE_AOT_COMPILE defaults to 1 on torch >= 2.10) goes through
    `compilation/caching.py`, which calls `initialize_cache(..., disable_cache=True)` and leaves
    TRITON_CACHE_DIR alone, so the lookup happens in a different directory and misses. The worker
    therefore pins autotune lookups to one stable directory (see turingbox_plugin.autotune).
"""
from __future__ import annotations

import sys

from turingbox_plugin import contract
from turingbox_plugin.activation import argv_additional_config, resolve_settings

__version__ = "0.1.0"

# Defaults that must precede the first @triton.autotune import in every process (see above).
ENV_DEFAULTS = {"TRITON_CACHE_AUTOTUNING": "1"}

_registered = False


def register() -> None:
    """vllm.general_plugins entry point: cheap, re-entrant, never touches CUDA.

    Inactive (no "turingbox" key in --additional-config, turingbox_plugin.contract): does nothing.
    Active: only sets ENV_DEFAULTS with setdefault (a user's explicit value always wins).
    Worker-side behaviour lives in the worker class, which vLLM instantiates only in workers.
    """
    global _registered
    if _registered:
        return
    _registered = True
    try:
        settings = resolve_settings(argv_additional_config(sys.argv))
    except ValueError:
        # A malformed section is reported (fatally) by the worker, which owns the startup failure;
        # an entry point that raises would only be logged by vLLM and then ignored.
        return
    if not settings.active:
        return
    if "vllm" in sys.modules:    # a vLLM process (API server: request checks; engine core: grammars); never raises
        try:
            # local: only a vLLM process patches vLLM; every appliance process imports this package (3.8 ms)
            from turingbox_plugin.vllm_fixes import apply_at_register
            apply_at_register()
        except Exception:
            pass
    for key, value in ENV_DEFAULTS.items():
        # defaults for vLLM's/Triton's own variables, set before vLLM reads them
        contract.set_default_variable(key, value)
