"""AOT Triton compiles without a GPU land exactly where a real launch looks them up.

The proof runs Triton's real launch path (JITFunction.run via `warmup`) against a driver that
reports an sm_75 device — the only part a GPU machine would supply — and checks that the kernel
comes from the AOT cache: the cache directory does not change and the backend's compile stages
are never entered.
"""
import json
import os
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from turingbox_warmup.image import triton_aot  # noqa: E402
# aot_kernels is a top-level module here and in the child (PYTHONPATH): a kernel's recorded name is module:function
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aot_kernels import scale_copy_kernel  # noqa: E402


class StubCudaDriver:
    """Reports one device of the given arch; everything the launch path asks before launching."""

    def __init__(self, arch):
        self.target = triton_aot.gpu_target(arch)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def launch_args(n=4096):
    src = torch.empty(n, dtype=torch.float16)
    dst = torch.empty(n, dtype=torch.float16)
    assert src.data_ptr() % 16 == 0 and dst.data_ptr() % 16 == 0  # like CUDA allocations
    return [src, dst, n, 0.5]


def all_files(d):
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)


@pytest.fixture
def fresh_kernel(monkeypatch):
    scale_copy_kernel.device_caches.clear()  # no in-memory kernels from other tests
    yield scale_copy_kernel
    scale_copy_kernel.device_caches.clear()


def launch_warmup(kernel, arch, cache_dir, monkeypatch, args):
    """Triton's own launch path (binder, _pack_args, ASTSource, compile) on a stub sm_XY device."""
    monkeypatch.setenv("TRITON_CACHE_DIR", cache_dir)
    driver.set_active(StubCudaDriver(arch))
    try:
        return kernel.warmup(*args, BLOCK=256, num_warps=4, grid=(16,))
    finally:
        driver._active = None  # back to picking the real driver lazily (reset_active would probe CUDA now)


def forbid_compiling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the runtime compiled the kernel instead of loading it from the AOT cache")
    monkeypatch.setattr(CUDABackend, "add_stages", refuse)


def test_aot_kernel_is_found_by_a_real_launch_on_sm75(tmp_path, fresh_kernel, monkeypatch):
    cache_dir = str(tmp_path / "triton")
    spec = triton_aot.record_from_args(fresh_kernel, launch_args(), arch="7.5", BLOCK=256, num_warps=4)
    assert spec.attrs  # the aligned pointers and n=4096 carry tt.divisibility=16
    built = triton_aot.compile_aot(fresh_kernel, spec, "7.5", cache_dir)
    assert built["hash"] == built["expected_hash"] and os.path.isdir(built["path"])
    before = all_files(cache_dir)
    forbid_compiling(monkeypatch)
    kernel = launch_warmup(fresh_kernel, "7.5", cache_dir, monkeypatch, launch_args())
    assert kernel.hash == built["hash"]
    assert kernel.metadata.target.arch == 75
    assert all_files(cache_dir) == before  # nothing compiled, nothing written


def test_every_target_arch_gets_its_own_entry_and_a_replayed_capture_matches(tmp_path, fresh_kernel, monkeypatch):
    cache_dir = str(tmp_path / "triton")
    spec = triton_aot.record_from_args(fresh_kernel, launch_args(), arch="9.0", BLOCK=256, num_warps=4)
    # Round trip through the JSON format the GPU capture hook writes (Triton's own serialization).
    replayed = triton_aot.record_from_json(spec.to_json(fresh_kernel))
    hashes = {arch: triton_aot.compile_aot(fresh_kernel, replayed, arch, cache_dir)["hash"] for arch in ("7.5", "8.6")}
    assert len(set(hashes.values())) == 2
    forbid_compiling(monkeypatch)
    kernel = launch_warmup(fresh_kernel, "8.6", cache_dir, monkeypatch, launch_args())
    assert kernel.hash == hashes["8.6"]


def test_a_launch_with_another_specialization_misses(tmp_path, fresh_kernel, monkeypatch):
    """Sensitivity: n not divisible by 16 is a different kernel, so the AOT set must include it."""
    cache_dir = str(tmp_path / "triton")
    spec = triton_aot.record_from_args(fresh_kernel, launch_args(4096), arch="7.5", BLOCK=256, num_warps=4)
    triton_aot.compile_aot(fresh_kernel, spec, "7.5", cache_dir)
    odd = triton_aot.record_from_args(fresh_kernel, launch_args(4095), arch="7.5", BLOCK=256, num_warps=4)
    assert triton_aot.cache_hash(fresh_kernel, odd, "7.5") != triton_aot.cache_hash(fresh_kernel, spec, "7.5")
    forbid_compiling(monkeypatch)
    with pytest.raises(AssertionError, match="compiled the kernel"):
        launch_warmup(fresh_kernel, "7.5", cache_dir, monkeypatch, launch_args(4095))


def test_cli_compiles_captured_specs_for_several_archs(tmp_path, fresh_kernel):
    spec = triton_aot.record_from_args(fresh_kernel, launch_args(), arch="7.5", BLOCK=256, num_warps=4)
    specs = tmp_path / "specs.jsonl"
    specs.write_text(json.dumps({"kernel": "aot_kernels:scale_copy_kernel",
                                 "specialization": json.loads(spec.to_json(fresh_kernel))}) + "\n")
    import subprocess, sys
    r = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--specs", str(specs), "--arch", "7.5,8.0",
                        "--cache-dir", str(tmp_path / "c")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert r.returncode == 0, r.stderr
    rows = [json.loads(l) for l in r.stdout.splitlines()]
    kernels, host = rows[:-1], rows[-1]
    assert [row["arch"] for row in kernels] == ["7.5", "8.0"]
    assert all(row["hash"] == row["expected_hash"] for row in kernels)
    assert host == {"host_modules": {"launchers": 1, "built": 2}}  # one launcher for both archs, plus cuda_utils
    sos = [f for f in all_files(str(tmp_path / "c")) if f.endswith(".so")]
    assert sorted(f.split(os.sep)[-1].split(".")[0] for f in sos) == ["__triton_launcher", "cuda_utils"]
    bad = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--specs", str(tmp_path / "none"),
                          "--cache-dir", str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "bad input" in bad.stderr


def test_a_launch_captured_by_the_hook_replays_to_the_same_kernel(tmp_path, fresh_kernel, monkeypatch):
    """The GPU-side capture (Triton's real post-compile hook call) -> JSON line -> AOT compile elsewhere."""
    from triton import knobs
    records = str(tmp_path / "records.jsonl")
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", triton_aot.capture_hook(records))
    launched = launch_warmup(fresh_kernel, "9.0", str(tmp_path / "gpu-run-cache"), monkeypatch, launch_args())
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    [rec] = triton_aot.load_specs(records)
    assert rec["kernel"] == "aot_kernels:scale_copy_kernel"
    rebuilt = triton_aot.compile_aot(triton_aot.resolve_kernel(rec["kernel"]), triton_aot.record_from_json(rec["specialization"]), "9.0",
                              str(tmp_path / "aot"))
    assert rebuilt["hash"] == launched.hash


def test_the_launcher_and_cuda_utils_triton_would_build_come_from_the_aot_cache(tmp_path, fresh_kernel, monkeypatch):
    """Triton's CudaLauncher for the AOT kernel (and its cuda_utils module) look their C modules up in the
    AOT cache and never run the C compiler: a start from baked kernels alone builds nothing before ready."""
    from pathlib import Path

    from triton.backends.nvidia import driver as nvdriver
    from triton.runtime import build

    cache_dir = str(tmp_path / "triton")
    spec = triton_aot.record_from_args(fresh_kernel, launch_args(), arch="7.5", BLOCK=256, num_warps=4)
    src, metadata = triton_aot.compile_aot(fresh_kernel, spec, "7.5", cache_dir)["_launch"]
    counts = triton_aot.build_host_modules([(src, metadata), (src, metadata)], cache_dir)
    assert counts == {"launchers": 1, "built": 2}
    assert triton_aot.build_host_modules([(src, metadata)], cache_dir)["built"] == 0  # already there: nothing rebuilt

    loaded = []

    def refuse_build(*a, **k):
        raise AssertionError("Triton ran the C compiler instead of loading the module from the AOT cache")

    def record_load(name, path):  # loading needs the real libcuda.so.1; where it loads from is the point
        loaded.append((name, path))
        return type("Module", (), {"launch": staticmethod(lambda *a: None)})

    monkeypatch.setattr(build, "_build", refuse_build)
    monkeypatch.setattr(build, "_load_module_from_path", record_load)
    monkeypatch.setattr(nvdriver, "library_dirs", lambda: [])
    monkeypatch.setenv("TRITON_CACHE_DIR", cache_dir)
    nvdriver.CudaLauncher(src, metadata)
    build.compile_module_from_src(src=Path(nvdriver.dirname, "driver.c").read_text(), name="cuda_utils")
    assert [name for name, _ in loaded] == ["__triton_launcher", "cuda_utils"]
    assert all(path.startswith(cache_dir + os.sep) for _, path in loaded)

