"""FlashInfer modules built ahead of time: the baked layout FlashInfer loads without nvcc, and the sm_75
shared-memory check of the head_dim-256 prefill (real nvcc compiles, no GPU).

Needs FlashInfer 0.6.8.post1's source (see test_flashinfer_specs.py), torch, ninja and nvcc; skips locally
without them and fails under CI=1. test_sm75_launched_prefill_kernels_fit compiles the two kernels vLLM launches
on a 2080 Ti (~1.5 min on 2 cores); building the whole module takes ~12 min there, so the full build is the
image's job (Dockerfile) and bench/gpu/flashinfer_baked_check.sh's.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys

import pytest

from turingbox_warmup.image import flashinfer_aot as fa
from tests.support.plan_factory import cache_settings

FI_SRC = fa.default_flashinfer_src()
HAVE_FI = bool(FI_SRC) and os.path.isfile(os.path.join(FI_SRC, "jit", "core.py"))
CUDA_HOME = fa.find_cuda_home()
SM75_OPTIN = 65536


def need(ok: bool, what: str):
    if not ok:
        if os.environ.get("CI"):
            pytest.fail(f"{what} is missing under CI (make test-setup installs it)")
        pytest.skip(f"{what} not found")


def sm75_prefill() -> dict:
    return next(r for r in fa.select(fa.load_specs()[1], "7.5") if r["module"] == "batch_prefill")


def fake_build(tmp_path, rec, payload=b"\x7fELF fake module"):
    """A FlashInfer build tree holding `<uri>.so` where JitSpec.build() leaves it."""
    build = tmp_path / "build"
    d = fa.module_dir(str(build), rec["workspace_arch"], rec["uri"])
    os.makedirs(d)
    with open(os.path.join(d, rec["uri"] + ".so"), "wb") as f:
        f.write(payload)
    return str(build)


def make_readonly(top):
    for dirpath, dirs, files in os.walk(top):
        for n in files:
            os.chmod(os.path.join(dirpath, n), 0o444)
        for n in dirs:
            os.chmod(os.path.join(dirpath, n), 0o555)


# ---- layout and seeding --------------------------------------------------------------------------------------

def test_export_writes_the_layout_flashinfer_loads_from(tmp_path):
    rec = sm75_prefill()
    out = tmp_path / "aot"
    path = fa.export_module(fake_build(tmp_path, rec), str(out), rec, {"build_seconds": 1.0})
    assert path == os.path.join(str(out), ".cache", "flashinfer", "0.6.8.post1", "75", "cached_ops", rec["uri"])
    assert sorted(os.listdir(path)) == sorted([rec["uri"] + ".so", "build.ninja", fa.MARKER])
    ninja = open(os.path.join(path, "build.ninja")).read()
    assert f"build {rec['uri']}.so: phony" in ninja and "nvcc" not in ninja.split("\n", 3)[-1]
    [mod] = fa.prebuilt_modules(str(out))
    assert mod["uri"] == rec["uri"] and mod["workspace_arch"] == "75" and mod["flashinfer_version"] == "0.6.8.post1"


def test_seed_copies_missing_modules_once_and_never_replaces_one(tmp_path):
    rec = sm75_prefill()
    aot = tmp_path / "aot"
    fa.export_module(fake_build(tmp_path, rec), str(aot), rec, {})
    make_readonly(str(aot))                      # as in the image layer
    ws = tmp_path / "entry" / "flashinfer"
    assert fa.seed_workspace(str(aot), str(ws)) == 1
    so = os.path.join(fa.module_dir(str(ws), "75", rec["uri"]), rec["uri"] + ".so")
    assert open(so, "rb").read() == b"\x7fELF fake module"
    assert os.stat(so).st_mode & stat.S_IWUSR       # the engine may write next to it
    with open(so, "wb") as f:
        f.write(b"JIT-built by FlashInfer later")
    assert fa.seed_workspace(str(aot), str(ws)) == 0
    assert open(so, "rb").read() == b"JIT-built by FlashInfer later"
    assert fa.seed_workspace(str(tmp_path / "nothing"), str(ws)) == 0


def test_install_cli(tmp_path):
    rec = sm75_prefill()
    aot = tmp_path / "aot"
    fa.export_module(fake_build(tmp_path, rec), str(aot), rec, {})
    r = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.flashinfer_aot", "install", "--from", str(aot),
                        "--workspace-base", str(tmp_path / "ws")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["installed"] == 1


# Logs every call; answers FlashInfer's `nvcc --version` probe (cpp_ext.get_cuda_version) and fails compiles.
NVCC_SHIM = """#!/bin/sh
echo "$@" >> {log}
if [ "$1" = --version ]; then echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0; fi
exit 1
"""


def flashinfer_build(workspace: str, rec: dict, shim_dir: str) -> subprocess.CompletedProcess:
    """FlashInfer's own gen_batch_prefill_module(...).build() as vLLM's first prefill runs it (minus loading),
    with `nvcc` a shim that logs and fails: CUDA_HOME points at the shim's directory."""
    env = fa.build_env(rec["arch"], workspace, shim_dir, None, None, None)
    env["PYTHONPATH"] = os.path.dirname(FI_SRC) + os.pathsep + env.get("PYTHONPATH", "")
    code = ("import json, sys, torch\n"
            "from flashinfer.jit.attention.modules import gen_batch_prefill_module\n"
            "rec = json.loads(sys.argv[1])\n"
            "args = {k: (getattr(torch, v) if k.startswith('dtype_') else v) for k, v in rec['args'].items()}\n"
            "spec = gen_batch_prefill_module(**args)\n"
            "spec.build(verbose=True)\n"
            "print('LIB', spec.jit_library_path)\n")
    return subprocess.run([sys.executable, "-c", code, json.dumps(rec)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_flashinfer_runs_no_nvcc_for_a_seeded_module_and_does_without_it(tmp_path):
    need(HAVE_FI, "FlashInfer 0.6.8.post1 source")
    need(shutil.which("ninja") is not None, "ninja")
    pytest.importorskip("torch")
    rec = sm75_prefill()
    shim = tmp_path / "cuda" / "bin"
    os.makedirs(shim)
    log = tmp_path / "nvcc.log"
    (shim / "nvcc").write_text(NVCC_SHIM.format(log=log))
    os.chmod(shim / "nvcc", 0o755)
    aot = tmp_path / "aot"
    fa.export_module(fake_build(tmp_path, rec), str(aot), rec, {})
    make_readonly(str(aot))
    # Seeded: FlashInfer finds build.ninja, ninja has nothing to do, the library is the baked one.
    ws = tmp_path / "entry" / "flashinfer"
    assert fa.seed_workspace(str(aot), str(ws)) == 1
    r = flashinfer_build(str(ws), rec, str(shim.parent))
    assert r.returncode == 0, r.stderr[-1500:]
    assert not log.exists(), log.read_text()
    lib = r.stdout.split("LIB ", 1)[1].strip()
    assert lib == os.path.join(fa.module_dir(str(ws), "75", rec["uri"]), rec["uri"] + ".so")
    assert open(lib, "rb").read() == b"\x7fELF fake module"
    # Not seeded (the control): the same call compiles, i.e. runs nvcc, which the shim refuses.
    cold = flashinfer_build(str(tmp_path / "cold"), rec, str(shim.parent))
    assert cold.returncode != 0 and "Ninja build failed" in cold.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "--version" and any("batch_prefill_paged_kernel_mask" in c for c in calls[1:])


# ---- parsers and FlashInfer's dispatch ---------------------------------------------------------------------

PTXAS = """ptxas info    : Compiling entry function '_ZN10flashinfer34BatchPrefillWithPagedKVCacheKernelINS_12KernelTraitsILNS_8MaskModeE1ELj64ELj1ELj4ELj16ELj16ELj4ELj1ELNS_15PosEncodingModeE0E6__half13__nv_fp8_e4m3S4_fiNS_16DefaultAttentionILb0ELb0ELb0ELb0EEEEE11PagedParamsEEvT0_' for 'sm_75'
ptxas info    : Function properties for _ZN10flashinfer34BatchPrefillWithPagedKVCacheKernel
    48 bytes stack frame, 48 bytes spill stores, 52 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 48 bytes cumulative stack size, 672 bytes cmem[0], 16 bytes cmem[2]
ptxas info    : Compiling entry function '_Z1kv' for 'sm_75'
ptxas info    : Used 8 registers, 1024 bytes smem, 352 bytes cmem[0]
"""
CUOBJDUMP = """
Resource usage:
 Common:
  GLOBAL:0
 Function _ZN10flashinfer34BatchPrefillWithPagedKVCacheKernelINS_12KernelTraitsILNS_8MaskModeE1ELj64ELj1ELj4ELj16ELj16ELj4ELj1ELNS_15PosEncodingModeE0E6__half13__nv_fp8_e4m3S4_fiNS_16DefaultAttentionILb0ELb0ELb0ELb0EEEEE11PagedParamsEEvT0_:
  REG:255 STACK:48 SHARED:0 LOCAL:0 CONSTANT[2]:16 CONSTANT[0]:672 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z1kv:
  REG:8 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:352 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_tool_output_parsers():
    p = fa.parse_ptxas_log(PTXAS)
    k = next(v for n, v in p.items() if "Paged" in n)
    assert k == {"registers": 255, "spill_stores": 48, "spill_loads": 52, "stack_bytes": 48, "static_smem": 0}
    assert p["_Z1kv"]["static_smem"] == 1024 and p["_Z1kv"]["registers"] == 8
    c = fa.parse_cuobjdump_resources(CUOBJDUMP)
    assert c["_Z1kv"] == {"registers": 8, "stack_bytes": 0, "static_smem": 1024, "local_bytes": 0}
    name = next(n for n in c if "Paged" in n)
    if shutil.which("c++filt"):
        assert fa.kernel_config(fa.demangle([name])[name]) == (1, 64, 1, 4, 16, 16, 4, 1)


def test_dispatch_mirrors_flashinfers_tile_choice():
    # sm_75, head_dim 256, half q: CTA_TILE_Q 64 only; fp8 KV -> NUM_MMA_KV 4, fp16 KV -> 2. Both make q + k + v
    # exactly 65,536 bytes: the whole opt-in budget.
    assert fa.cta_tiles_q(75, 256) == [64]
    fp8 = fa.dispatch(75, 64, 256, 2, 1)
    assert (fp8["num_warps_q"], fp8["num_warps_kv"], fp8["num_mma_kv"], fp8["cta_tile_kv"]) == (4, 1, 4, 64)
    assert 64 * 256 * 2 + 2 * 64 * 256 * 1 == SM75_OPTIN
    assert fa.dispatch(75, 64, 256, 2, 2)["num_mma_kv"] == 2
    # sm_86 (100 KiB per SM): 16- and 64-row tiles; two CTAs per SM fit (2 x 40 KiB), so each gets 50 KiB and
    # (51200 - 32768) // 8192 = 2 KV MMAs
    assert fa.cta_tiles_q(86, 256) == [64, 16] and fa.dispatch(86, 64, 256, 2, 1)["num_mma_kv"] == 2
    assert fa.cta_tiles_q(75, 128) == [128, 64]
    assert [L["mask"] for L in fa.attention_launches(sm75_prefill())] == ["causal", "none"]


# ---- the real sm_75 check (nvcc, no GPU) ---------------------------------------------------------------------

def patched_flashinfer(tmp_path) -> str:
    """FlashInfer 0.6.8's tree with 0.6.10's SharedStorageQKVO padding (flashinfer#3528) put back in."""
    root = tmp_path / "fi" / "flashinfer"
    data = root / "data"
    os.makedirs(data)
    for name in ("csrc", "cutlass", "spdlog"):
        os.symlink(os.path.join(FI_SRC, "data", name), data / name)
    shutil.copytree(os.path.join(FI_SRC, "data", "include"), data / "include")
    path = data / "include" / "flashinfer" / "attention" / "prefill.cuh"
    text = path.read_text()
    old = "    alignas(16) DTypeO smem_o[CTA_TILE_Q * HEAD_DIM_VO];\n  };\n};"
    assert text.count(old) == 1
    path.write_text(text.replace(old, "    alignas(16) DTypeO smem_o[CTA_TILE_Q * HEAD_DIM_VO];\n  };\n"
                                      "  alignas(16) uint8_t k_sf_smem[1];\n  alignas(16) uint8_t v_sf_smem[1];\n};"))
    return str(root)


@pytest.fixture(scope="module")
def sm75_rows():
    need(HAVE_FI, "FlashInfer 0.6.8.post1 source")
    need(CUDA_HOME is not None, "nvcc")
    pytest.importorskip("tvm_ffi")
    return fa.resource_report("7.5", None, FI_SRC, [sm75_prefill()])


def test_sm75_launched_prefill_kernels_fit(sm75_rows):
    assert [r["launch"]["mask"] for r in sm75_rows] == ["causal", "none"]
    for r in sm75_rows:
        assert r["ok"] and r["fits"], r
        assert r["shared_dynamic_bytes"] == SM75_OPTIN            # sizeof(SharedStorage): exactly the budget
        assert r["shared_static_bytes"] == 0 and r["shared_bytes"] <= r["shared_limit_bytes"] == SM75_OPTIN
        assert 0 < r["registers"] <= 255 and r["spills"] is not None
        assert r["launch"]["cta_tile_q"] == 64 and r["launch"]["num_mma_kv"] == 4


def test_the_padding_of_flashinfer_0_6_10_does_not_fit(tmp_path):
    need(HAVE_FI, "FlashInfer 0.6.8.post1 source")
    need(CUDA_HOME is not None, "nvcc")
    pytest.importorskip("tvm_ffi")
    rows = fa.resource_report("7.5", None, patched_flashinfer(tmp_path), [sm75_prefill()], compile_kernels=False)
    assert rows and all(not r["ok"] for r in rows)
    assert {r["shared_dynamic_bytes"] for r in rows} == {65568}        # flashinfer#3528's number for fp8 KV
    assert "sm_75 allows 65536" in rows[0]["error"] and "65568" in rows[0]["error"]


def test_make_bake_ships_flashinfers_jit_modules_relocatable(tmp_path):
    """An entry seeded on a GPU host holds FlashInfer's own build.ninja (absolute paths of that host's entry);
    `make bake` ships the prebuilt one instead, so the image's copy at another path runs no nvcc either."""
    import io
    import tarfile

    from turingbox_warmup import bake
    rec = sm75_prefill()
    entry = tmp_path / "seed-host" / "entries" / "k"
    mod = fa.module_dir(str(entry / "flashinfer"), "75", rec["uri"])
    os.makedirs(mod)
    (entry / "manifest.json").write_text("{}")
    with open(os.path.join(mod, rec["uri"] + ".so"), "wb") as f:
        f.write(b"\x7fELF jit-built")
    with open(os.path.join(mod, "build.ninja"), "w") as f:
        f.write(f"build {mod}/x.cuda.o: cuda_compile /seed-host/generated/x.cu\n")
    os.makedirs(entry / "flashinfer" / "other")
    (entry / "flashinfer" / "other" / "build.ninja").write_text("not a module dir\n")
    ctx = bake.build_context(str(entry), "k", "FROM scratch\n", {"key": "k"})
    with tarfile.open(fileobj=io.BytesIO(ctx.getvalue())) as tar:
        names = tar.getnames()
        rel = os.path.relpath(mod, entry)
        ninja = tar.extractfile(f"entry/{rel}/build.ninja").read().decode()
        other = tar.extractfile("entry/flashinfer/other/build.ninja").read().decode()
        assert f"entry/{rel}/{rec['uri']}.so" in names
    assert f"build {rec['uri']}.so: phony" in ninja and "/seed-host/" not in ninja
    assert other == "not a module dir\n"
    assert fa.relocatable_ninja(str(tmp_path)) is None


def test_a_new_cache_entry_starts_with_the_baked_modules(tmp_path):
    """prepare_cache on a miss copies TURINGBOX_AOT_FLASHINFER_DIR's modules into the entry's flashinfer/ (the
    FLASHINFER_WORKSPACE_BASE vLLM gets), as it copies the AOT Triton kernels."""
    from turingbox.cache import store
    rec = sm75_prefill()
    aot = tmp_path / "aot"
    fa.export_module(fake_build(tmp_path, rec), str(aot), rec, {})
    inputs = {"software": {}, "gpu_name": "NVIDIA GeForce RTX 2080 Ti", "compute_capability": "7.5", "plan": {},
              "model_config_hash": "x"}
    from turingbox.plan.fingerprint import cache_key
    plan = {"cache_inputs": inputs, "cache_key": cache_key(inputs)}
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "root"), {"TURINGBOX_AOT_FLASHINFER_DIR": str(aot)}, baked_cache_dir=""))
    try:
        assert s.status["result"] == "miss" and s.status["aot_flashinfer_modules"] == 1
        so = os.path.join(fa.module_dir(s.env["FLASHINFER_WORKSPACE_BASE"], "75", rec["uri"]), rec["uri"] + ".so")
        assert open(so, "rb").read() == b"\x7fELF fake module"
    finally:
        s.close()
