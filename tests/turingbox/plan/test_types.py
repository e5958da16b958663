"""`turingbox.plan.types.Plan`: frozen, and its to_dict() is the plan JSON contract (DESIGN "Plan JSON")."""
from __future__ import annotations

import dataclasses
import json

import pytest

from turingbox.plan.types import Plan, PluginConfig

# DESIGN.md "Plan JSON": the keys the contract promises at least.
CONTRACT_KEYS = {"tensor_parallel_size", "num_speculative_tokens", "gpu_memory_utilization", "max_model_len",
                 "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "attention_backend", "dtype", "gpus",
                 "vllm_args", "cache_key", "reasons"}
# The whole object today, in its order (docs/planning.md shows it; consumers and tests read these keys).
ALL_KEYS = ["tensor_parallel_size", "data_parallel_size", "objective", "num_speculative_tokens",
            "mtp_refused_parameters", "gpu_memory_utilization", "max_model_len", "max_num_seqs",
            "max_num_batched_tokens", "kv_cache_dtype", "attention_backend", "dtype", "gdn_prefill_backend",
            "gdn_path", "quantization", "cudagraph_capture_sizes", "enforce_eager", "prefix_caching",
            "disable_custom_all_reduce", "compute_capability", "gpu_name", "gpus", "gpu_indices", "excluded_gpus",
            "model", "served_model_name", "demo", "demo_fallback", "load_format", "memory", "plugin", "env",
            "vllm_args", "reasons", "cache_inputs", "cache_key"]


@pytest.fixture(scope="module", params=["4x2080ti-22g", "1xh200"])
def plan(request) -> Plan:
    from tests.support.plan_factory import planned
    return planned(request.param)


def test_plan_is_frozen(plan):
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.max_num_seqs = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.plugin.gdn = "turbo"
    assert isinstance(plan.vllm_args, tuple) and isinstance(plan.reasons, tuple) and isinstance(plan.gpus, tuple)
    assert isinstance(plan.plugin, PluginConfig)


def test_to_dict_is_the_json_contract_and_round_trips(plan):
    d = plan.to_dict()
    assert list(d) == ALL_KEYS and CONTRACT_KEYS <= set(d)
    back = json.loads(json.dumps(d))
    assert back == d and list(back) == ALL_KEYS
    assert isinstance(back["vllm_args"], list) and all(isinstance(a, str) for a in back["vllm_args"])
    assert isinstance(back["gpus"], list) and back["plugin"]["max_num_seqs"] == plan.max_num_seqs
    again = Plan.from_dict(back)
    assert again == plan and again.to_dict() == d
    # a copy: changing the dict leaves the plan alone
    d["env"]["CUDA_VISIBLE_DEVICES"] = "9"
    d["memory"]["block_size"] = -1
    assert plan.env["CUDA_VISIBLE_DEVICES"] != "9" and plan.memory.block_size != -1


def test_vllm_args_carry_the_typed_fields(plan):
    a = plan.vllm_args
    assert a[:2] == ("serve", plan.model)
    assert a[a.index("--max-num-seqs") + 1] == str(plan.max_num_seqs)
    assert a[a.index("--gpu-memory-utilization") + 1] == str(plan.gpu_memory_utilization)
    extra = json.loads(a[a.index("--additional-config") + 1])
    assert extra == {"turingbox": plan.plugin.to_dict()}


def test_from_dict_names_missing_keys(plan):
    d = plan.to_dict()
    del d["vllm_args"], d["memory"]
    with pytest.raises(ValueError, match="lacks memory, vllm_args"):
        Plan.from_dict(d)
    with pytest.raises(ValueError, match="not an object"):
        Plan.from_dict([1, 2])


def test_the_cache_key_is_the_plans_hash_of_its_cache_inputs(plan):
    assert plan.compute_hash() == plan.cache_key == Plan.from_dict(plan.to_dict()).compute_hash()
    assert plan.cache_inputs["plan"]["max_num_seqs"] == plan.max_num_seqs
    assert dataclasses.replace(plan, cache_inputs={**plan.cache_inputs, "gpu_name": "other"}).compute_hash() != plan.cache_key


# The plan JSON's "memory" object today, in its order (docs/planning.md shows it).
MEMORY_KEYS = ["gpu_total_gib", "gpu_free_gib", "gpu_memory_utilization", "requested_gib", "outside_budget_gib",
               "outside_budget_mib", "weights_gib", "weights_breakdown_gib", "activation_gib", "non_torch_gib",
               "cudagraph_gib", "kv_cache_gib", "kv_cache_bytes", "kv_cache_tokens", "kv_safety_margin_gib",
               "kv_needed_gib", "kv_all_seqs_at_max_len_gib", "kv_bytes_per_token", "gdn_state_per_seq_gib",
               "num_gpu_blocks", "block_size", "page_size_bytes", "layers_per_pool_block", "kv_cache_groups",
               "max_concurrency_at_max_len"]


def test_the_memory_breakdown_is_typed_and_its_json_unchanged(plan):
    m = plan.to_dict()["memory"]
    assert list(m) == MEMORY_KEYS
    assert list(m["outside_budget_mib"]) == ["cuda_context_mib", "nccl_mib", "flashinfer_workspace_mib",
                                             "post_kv_slack_mib", "shared_gpu_headroom_mib"]
    assert list(m["weights_breakdown_gib"]) == ["layers", "embeddings", "mtp", "vision", "other"]
    assert list(m["kv_cache_groups"]) == ["attention", "gdn"]
    assert plan.memory.kv_cache_groups.attention == m["kv_cache_groups"]["attention"] >= 1
    assert abs(plan.memory.outside_budget_mib.total_mib / 1024 - plan.memory.outside_budget_gib) < 0.001
    del m["outside_budget_mib"]["nccl_mib"]
    with pytest.raises(ValueError, match="memory.outside_budget_mib lacks nccl_mib"):
        Plan.from_dict({**plan.to_dict(), "memory": m})
