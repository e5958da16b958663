"""sm_75 compile evidence on a machine without a GPU (runs in CI)."""

import pytest

from turingbox_plugin.gdn import compile_report
from turingbox_plugin.gdn.compile import count_sass, normalize_arch, parse_ptxas, short_name

SM75_SHARED_PER_BLOCK = 64 * 1024
STATIC_SHARED_LIMIT = 48 * 1024  # no opt-in attribute needed (graph capture stays simple)


def test_every_kernel_compiles_for_sm75(sm75_report):
    names = {(r["name"], r["dtype"]) for r in sm75_report}
    assert all(r["ok"] for r in sm75_report), sm75_report
    for kernel in ("gdn_chunk_prep_kernel", "gdn_chunk_state_kernel", "gdn_decode_kernel"):
        assert {(kernel, "fp16"), (kernel, "bf16")} <= names
    assert all(r["arch"] == "7.5" for r in sm75_report)


def test_decode_path_has_no_register_spills(sm75_report):
    decode = [r for r in sm75_report if r["path"] == "decode"]
    assert decode
    for r in decode:
        assert r["spills"] == 0 and r["stack_bytes"] == 0, r
        assert r["registers"] <= 255


def test_prefill_fits_sm75_shared_memory_without_spills(sm75_report):
    for r in (r for r in sm75_report if r["path"] == "prefill"):
        assert 0 < r["shared_bytes"] <= STATIC_SHARED_LIMIT <= SM75_SHARED_PER_BLOCK, r
        assert r["spills"] == 0, r


def test_prefill_sass_uses_tensor_cores_on_sm75(sm75_report):
    prefill = [r for r in sm75_report if r["path"] == "prefill"]
    if any(r["hmma"] is None for r in prefill):
        pytest.skip("cuobjdump is not available to disassemble SASS")
    for r in prefill:
        assert r["hmma"] > 0, f"{r['name']} ({r['dtype']}) has no HMMA instruction on sm_75"


def test_arch_spellings():
    assert normalize_arch("7.5") == normalize_arch("sm_75") == normalize_arch("75") == "75"
    with pytest.raises(ValueError, match="7.5, 75 or sm_75"):
        normalize_arch("turing")


def test_compile_failure_is_reported_not_raised(tmp_path):
    (tmp_path / "gdn_prefill.cu").write_text("this is not C++;\n")
    (tmp_path / "gdn_decode.cu").write_text("__global__ void k() {}\n")
    report = compile_report("7.5", sources_dir=tmp_path)
    bad = [r for r in report if not r["ok"]]
    assert [r["name"] for r in bad] == ["gdn_prefill.cu"] and bad[0]["error"]
    assert [r["mangled"] for r in report if r["ok"]] == ["_Z1kv"]


def test_parsers_on_tool_output_shapes():
    ptxas = (
        "ptxas info    : Compiling entry function '_ZN5tbgdn17gdn_decode_kernelI6__halfEEvNS_10DecodeArgsE' for 'sm_75'\n"
        "ptxas info    : Function properties for _ZN5tbgdn17gdn_decode_kernelI6__halfEEvNS_10DecodeArgsE\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 99 registers, used 1 barriers, 1064 bytes smem, 616 bytes cmem[0]\n"
    )
    info = parse_ptxas(ptxas)["_ZN5tbgdn17gdn_decode_kernelI6__halfEEvNS_10DecodeArgsE"]
    assert info == {"arch": "sm_75", "stack_bytes": 8, "spill_stores": 4, "spill_loads": 12,
                    "registers": 99, "shared_bytes": 1064}
    assert short_name("_ZN5tbgdn21gdn_chunk_prep_kernelI13__nv_bfloat16EEvNS_8PrepArgsE") == (
        "gdn_chunk_prep_kernel", "bf16")
    sass = "\t\tFunction : f1\n  HMMA.1688.F32 R0, R2, R4, R0 ;\n\t\tFunction : f2\n  FFMA R1, R2, R3, R4 ;\n"
    assert count_sass(sass) == {"f1": 1, "f2": 0}
