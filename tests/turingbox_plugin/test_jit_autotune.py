"""JIT accounting hook chaining (real triton.knobs), autotune pruning on real Triton autotuners,
and a plugin kernel launched through Triton's interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import triton
from triton import knobs

from turingbox_plugin.autotune import dedupe_num_stages, stages_matter
from turingbox_plugin.jit_accounting import JitAccountant, kernel_name


def _hook_kwargs(name: str) -> dict:
    from triton.runtime.jit import JitFunctionInfo

    return {"key": "k", "repr": name, "fn": JitFunctionInfo("mod", name, None), "compile": {},
            "is_manual_warmup": False, "already_compiled": False}


def _vllm_like_monitor(seen: list):
    """Same chaining as vllm/triton_utils/jit_monitor.py::_setup_triton_jit_hook."""
    existing = knobs.runtime.jit_post_compile_hook

    def _on_jit_compile(**kwargs):
        seen.append(getattr(kwargs.get("fn"), "name", "<unknown>"))
        if existing is not None:
            return existing(**kwargs)
        return None

    knobs.runtime.jit_post_compile_hook = _on_jit_compile


def test_accounting_chains_both_ways_and_splits_ready():
    saved = knobs.runtime.jit_post_compile_hook
    earlier: list = []
    monitor: list = []
    after: list = []
    try:
        knobs.runtime.jit_post_compile_hook = lambda **kw: earlier.append(kw["fn"].name)
        acc = JitAccountant(on_jit_after_ready=lambda name, kw: after.append(name))
        assert acc.install()
        assert acc.install()                          # idempotent: no self-chaining
        _vllm_like_monitor(monitor)                   # vLLM installs its monitor after ours
        hook = knobs.runtime.jit_post_compile_hook
        hook(**_hook_kwargs("_zero_kv_blocks_kernel"))
        hook(**_hook_kwargs("_zero_kv_blocks_kernel"))
        acc.mark_ready()
        hook(**_hook_kwargs("rejection_greedy_sample_kernel"))
        snap = acc.snapshot()
        assert snap["kernels_before_ready"] == 2 and snap["distinct_kernels_before_ready"] == 1
        assert snap["jit_after_ready"] == {"rejection_greedy_sample_kernel": 1}
        assert after == ["rejection_greedy_sample_kernel"]
        assert monitor == earlier == ["_zero_kv_blocks_kernel", "_zero_kv_blocks_kernel",
                                      "rejection_greedy_sample_kernel"]
    finally:
        knobs.runtime.jit_post_compile_hook = saved


def test_accounting_survives_a_failing_callback_and_odd_fn():
    acc = JitAccountant(on_jit_after_ready=lambda *a: 1 / 0)
    acc.mark_ready()
    acc.hook(fn=None)                                  # must not raise into Triton
    assert acc.after_ready == {"<unknown>": 1}
    assert kernel_name(type("F", (), {"name": "pkg.mod.kern"})()) == "kern"


FLA_LIKE = [triton.Config({"BV": bv}, num_warps=w, num_stages=s) for w in (2, 4) for s in (2, 3, 4) for bv in (32, 64)]


def test_dedupe_num_stages_keeps_first_of_each_group():
    kept = dedupe_num_stages(FLA_LIKE)
    assert len(FLA_LIKE) == 12 and len(kept) == 4
    assert {(c.kwargs["BV"], c.num_warps) for c in kept} == {(32, 2), (64, 2), (32, 4), (64, 4)}
    assert all(c.num_stages == 2 for c in kept)
    assert dedupe_num_stages([]) == []
    assert not stages_matter((7, 5)) and stages_matter((8, 0)) and stages_matter((9, 0))


INSTALL_PROBE = r"""
import json, os, triton, triton.language as tl
from triton import knobs
os.environ.pop("TRITON_CACHE_AUTOTUNING", None)
configs = [triton.Config({"B": b}, num_warps=w, num_stages=s) for w in (2, 4) for s in (2, 3, 4) for b in (32, 64)]
@triton.autotune(configs=configs, key=["n"])
@triton.jit
def k(x, n, B: tl.constexpr):
    pass
assert k.cache_results is False            # snapshotted at decoration, env unset
from turingbox_plugin import autotune
cap = os.environ["PROBE_CAP"].split(".")
assert autotune.install(True, None, capability=lambda: (int(cap[0]), int(cap[1])))
os.environ["TRITON_CACHE_AUTOTUNING"] = "1"  # set after import: honoured at tuning time
pruned = k.prune_configs({})
print(json.dumps({"n": len(pruned), "cache_results": k.cache_results}))
"""


def _install_probe(cap: str, tmp_path) -> dict:
    script = tmp_path / f"probe_{cap.replace('.', '')}.py"   # @triton.jit needs a real source file
    script.write_text(INSTALL_PROBE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PROBE_CAP": cap})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_installed_autotuner_prunes_only_below_sm80_and_rereads_cache_flag(tmp_path):
    assert _install_probe("7.5", tmp_path) == {"n": 4, "cache_results": True}
    assert _install_probe("9.0", tmp_path) == {"n": 12, "cache_results": True}


def test_plugin_kernel_under_triton_interpreter():
    code = ("import torch\nfrom turingbox_plugin.kernels import scaled_copy\n"
            "x = torch.randn(3001)\ny = scaled_copy(x, 0.25, block=256)\n"
            "print(float((y - x * 0.25).abs().max()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) == 0.0
