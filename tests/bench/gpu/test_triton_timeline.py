"""bench/gpu/triton_timeline.py on a real Triton cache: two kernels compiled by Triton itself (turingbox_warmup's
AOT path, no GPU), one of them dated 12 s later, beside an autotune record and a FlashInfer JIT module; the timeline
must name each, count the variants and report the 12-s gap."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "bench", "gpu", "triton_timeline.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import triton_timeline  # noqa: E402

KERNELS = textwrap.dedent('''
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    @triton.jit
    def scale_kernel(x, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)
''')


def _compile_all(tmp_path):
    import torch
    from turingbox_warmup.image import triton_aot
    mod = tmp_path / "tl_kernels.py"
    mod.write_text(KERNELS)
    copy = triton_aot.load_kernel_from_source(str(mod), "copy_kernel", "tl_kernels")
    scale = triton_aot.load_kernel_from_source(str(mod), "scale_kernel", "tl_kernels")
    cache = tmp_path / "root" / "triton"
    t = torch.empty(64)
    paths = []
    for fn, args, block in ((copy, [t, t, 64], 64), (copy, [t, t, 7], 128), (scale, [t, 64], 64)):
        spec = triton_aot.record_from_args(fn, args, arch="7.5", BLOCK=block)
        paths.append(triton_aot.compile_aot(fn, spec, "7.5", str(cache))["path"])
    return cache, paths


def test_timeline_names_kernels_counts_variants_and_finds_the_gap(tmp_path):
    cache, paths = _compile_all(tmp_path)
    base = 1_700_000_000
    for i, path in enumerate(paths):  # the scale kernel (last) compiled 12 s after the two copy variants
        for f in os.listdir(path):
            os.utime(os.path.join(path, f), (base + i + (12 if i == 2 else 0),) * 2)
    tune = cache / "tune"
    tune.mkdir()
    (tune / "copy_kernel.autotune.json").write_text(json.dumps({"configs_timings": []}))
    os.utime(tune / "copy_kernel.autotune.json", (base + 1.5,) * 2)

    fi = tmp_path / "root" / "flashinfer" / ".cache" / "flashinfer" / "0.6.8.post1" / "90a" / "cached_ops" / "sampling"
    fi.mkdir(parents=True)
    (fi / "sampling.so").write_bytes(b"\x7fELF")
    os.utime(fi / "sampling.so", (base + 16,) * 2)

    out = triton_timeline.timeline([str(tmp_path / "root")])
    assert out["kernels"] == 3 and out["autotune_records"] == 1 and out["flashinfer_modules"] == 1
    assert out["by_kernel"][-1]["name"] == "sampling" and out["by_kernel"][-1]["kind"] == "flashinfer"
    by = {(r["name"], r["kind"]): r for r in out["by_kernel"]}
    assert by[("copy_kernel", "kernel")]["count"] == 2
    assert by[("scale_kernel", "kernel")]["first_s"] == 14.0
    assert by[("copy_kernel", "autotune")]["first_s"] == 1.5
    assert out["gaps"] == [{"after_s": 1.5, "gap_s": 12.5, "before": "scale_kernel", "after": "copy_kernel"}]

    js = tmp_path / "t.json"
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "root"), "--json", str(js)],
                       capture_output=True, text=True, check=True)
    assert "3 kernels, 1 autotune records, 1 FlashInfer modules over 16.0 s" in r.stdout
    assert "gap   12.5 s" in r.stdout
    assert json.load(open(js))["kernels"] == 3


def test_empty_or_missing_root_is_an_empty_timeline(tmp_path):
    assert triton_timeline.timeline([str(tmp_path)])["kernels"] == 0
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "missing")], capture_output=True, text=True)
    assert r.returncode == 0 and "0 kernels" in r.stdout
