"""`turingbox verify --compile-only --arch 7.5 --json`: one table with the plugin's Triton kernels, the turbo GDN
kernels, the AOT Triton specializations and every kernel the image's sm_75 FlashInfer modules launch, each with
its shared memory against sm_75's 65,536-byte opt-in limit; exit 1 when one does not fit.

Real compiles without a GPU (Triton, nvcc): about 2-3 minutes on 2 cores. Needs FlashInfer 0.6.8.post1's source
(TURINGBOX_FLASHINFER_SRC here) and nvcc; skips locally without them, fails under CI=1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from turingbox_warmup.image import flashinfer_aot as fa

from tests.turingbox_warmup.image.test_flashinfer_aot import CUDA_HOME, FI_SRC, HAVE_FI, need, patched_flashinfer  # noqa: E402


def registered() -> set[str]:
    from importlib.metadata import entry_points
    from turingbox_plugin.verify import COMPILE_REPORTS_GROUP
    return {ep.value for ep in entry_points(group=COMPILE_REPORTS_GROUP)}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    want = {"turingbox_warmup.image.flashinfer_aot:verify_rows", "turingbox_warmup.image.triton_aot:verify_rows"}
    if not want <= registered():
        pytest.skip("pyproject.toml does not register the turingbox_plugin.compile_reports entry points yet "
                    f"({sorted(want - registered())}); then reinstall (make dev)")
    need(HAVE_FI, "FlashInfer 0.6.8.post1 source")
    need(CUDA_HOME is not None, "nvcc")
    pytest.importorskip("tvm_ffi")
    env = dict(os.environ, TURINGBOX_FLASHINFER_SRC=FI_SRC,
               TURINGBOX_AOT_FLASHINFER_DIR=str(tmp_path_factory.mktemp("no-baked-modules")))
    r = subprocess.run([sys.executable, "-m", "turingbox", "verify", "--compile-only", "--arch", "7.5", "--json"],
                       env=env, capture_output=True, text=True, timeout=1500)
    return r


def test_one_table_lists_every_kind_and_all_fit(report):
    assert report.returncode == 0, report.stderr[-2000:] + report.stdout[-2000:]
    data = json.loads(report.stdout)
    rows = data["kernels"]
    assert data["ok"] and all(r["ok"] for r in rows)
    kinds = {r.get("kind") for r in rows}
    assert {"flashinfer", "triton-aot"} <= kinds
    assert any(r["name"].startswith("gdn_") for r in rows)              # the turbo GDN kernels
    assert any(r["name"].startswith("scaled_copy_kernel") for r in rows)  # the plugin's own Triton kernels
    prefill = [r for r in rows if r["name"].startswith("flashinfer:batch_prefill")]
    assert [r["launch"]["mask"] for r in prefill] == ["causal", "none"]
    for r in prefill:
        assert r["uri"] == next(x["uri"] for x in fa.select(fa.load_specs()[1], "7.5") if x["module"] == "batch_prefill")
        assert r["shared_bytes"] == r["shared_static_bytes"] + r["shared_dynamic_bytes"] <= 65536 == r["shared_limit_bytes"]
        assert r["fits"] and r["registers"] > 0
    aot = [r for r in rows if r.get("kind") == "triton-aot"]
    assert len(aot) >= 40 and all(r["arch"] == "7.5" and r["shared_bytes"] <= 65536 for r in aot)


def test_text_table_names_the_flashinfer_kernels(report, tmp_path):
    assert report.returncode == 0
    # the same rows render as text lines of the one table (PASS/FAIL, shared, registers, spills)
    data = json.loads(report.stdout)
    assert any(r["name"].startswith("flashinfer:sampling") for r in data["kernels"])


def test_a_flashinfer_that_overflows_sm75_fails_the_report(tmp_path, monkeypatch):
    need(HAVE_FI, "FlashInfer 0.6.8.post1 source")
    need(CUDA_HOME is not None, "nvcc")
    pytest.importorskip("tvm_ffi")
    monkeypatch.setenv("TURINGBOX_FLASHINFER_SRC", patched_flashinfer(tmp_path))
    monkeypatch.setenv("TURINGBOX_AOT_FLASHINFER_DIR", str(tmp_path / "none"))
    rows = fa.verify_rows(75)
    bad = [r for r in rows if not r["ok"]]
    assert len(bad) == 2 and all("65568" in r["error"] for r in bad)
