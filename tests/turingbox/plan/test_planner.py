"""Planner table: fake inventories (DESIGN inventory JSON) x the real Qwen3.6-27B architecture.

Every case asserts computed behaviour (TP, MTP, what was left out, KV sizes within ranges derived in
the comments, shrinking and refusals), never a copy of the planner's output.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

import pytest

from turingbox.errors import PlanError, UsageError
from turingbox.gpus.inventory import read_inventory
from turingbox.plan import memory as mem
from turingbox.plan import planner
from turingbox.plan.planner import legal_tps, make_plan, tp_problem
from tests.support.plan_factory import plan_settings
from turingbox.config import PlanSettings
from turingbox_plugin.model_config import load_model_config

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "gpus"
ARCH_CANDIDATES = (REPO / "entrypoint" / "turingbox" / "data" / "qwen3.6-27b.json",)
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm",
       "modules_to_not_convert": ["visual", "mtp", "in_proj_ba"]}
SOFTWARE = {"vllm": "0.21.0", "torch": "2.11.0", "triton": "3.6.0", "flashinfer-python": "0.6.8",
            "turingbox-plugin": "0.1.0"}
GIB = 1 << 30


# ---- helpers shared with test_plan_cli.py ----------------------------------------------------------

def architecture() -> dict:
    for path in ARCH_CANDIDATES:
        if path.is_file():
            return json.loads(path.read_text())
    raise FileNotFoundError("qwen3.6-27b.json architecture not found")


def write_model(root: Path, name: str, awq: bool = False, mtp: bool = True, demo: bool = False,
                experts: int = 0) -> str:
    cfg = copy.deepcopy(architecture())
    if experts:
        cfg["text_config"]["num_experts"] = experts     # how vLLM 0.21 tells a MoE model (get_num_experts)
    if awq:
        cfg["quantization_config"] = copy.deepcopy(AWQ)
    if not mtp:
        cfg["text_config"]["mtp_num_hidden_layers"] = 0
    if demo:
        cfg["turingbox_demo"] = {"source": "qwen3.6-27b", "layers": 64, "awq": awq, "format": 1}
    d = Path(root) / name
    os.makedirs(d, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def fixture(name: str) -> str:
    return str(FIXTURES / f"{name}.json")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {
        "awq": load_model_config(write_model(root, "qwen-awq", awq=True)),
        "bf16": load_model_config(write_model(root, "qwen-bf16")),
        "nomtp": load_model_config(write_model(root, "qwen-awq-nomtp", awq=True, mtp=False)),
        "moe": load_model_config(write_model(root, "qwen-awq-moe", awq=True, experts=8)),
        "demo": load_model_config(write_model(root, "qwen-demo", demo=True)),
    }


def plan_for(models, inventory: str, model: str = "awq", env: dict | None = None, **settings):
    inv = read_inventory(fixture(inventory), env or {})
    return make_plan(inv, models[model], plan_settings(settings), SOFTWARE)


def uuids(inventory: str) -> list[str]:
    return [g["uuid"] for g in json.loads(Path(fixture(inventory)).read_text())]


def has_pair(args: list[str], flag: str, value: str | None = None) -> bool:
    if flag not in args:
        return False
    return value is None or args[args.index(flag) + 1] == value


# ---- the table ------------------------------------------------------------------------------------
# Each case: (id, inventory, model, settings, env, check(plan)) or expected error (type, words).

def _seed(p):
    # The seed: 4x 2080 Ti 22 GB, AWQ, full 262144 context. Per GPU ~22 GiB x 0.91 budget minus
    # ~4.6 GiB AWQ weights and ~2 GiB runtime leaves 10-16 GiB; one 262144-token sequence needs
    # 262144 x 17 layers x 512 B (fp8, 1 KV head per rank) = 2.1 GiB + GDN state.
    assert p.tensor_parallel_size == 4 and p.num_speculative_tokens == 4
    assert p.max_model_len == 262144
    assert (p.dtype, p.attention_backend, p.kv_cache_dtype) == ("half", "FLASHINFER", "fp8")
    assert 10 <= p.memory.kv_cache_gib <= 16
    assert p.memory.kv_cache_tokens >= 262144 * p.max_num_seqs
    assert p.max_num_seqs >= 2
    assert p.excluded_gpus == ()
    a = p.vllm_args
    assert has_pair(a, "--disable-custom-all-reduce") and has_pair(a, "--mamba-cache-mode", "align")
    assert has_pair(a, "--speculative-config", '{"method":"mtp","num_speculative_tokens":4}')
    assert any(r.startswith("MTP=4: 4 sm_75 GPUs in TP") for r in p.reasons)


def _two(p):
    assert p.tensor_parallel_size == 2 and p.num_speculative_tokens == 3
    # Twice the weights per GPU of TP=4, so less KV than the seed but still one full context.
    assert 4 <= p.memory.kv_cache_gib <= 12 and p.max_model_len == 262144


def _three(p):
    # 3 does not split 4 KV heads (neither divides the other) nor 16 GDN key heads: TP=2, one left out.
    assert p.tensor_parallel_size == 2
    assert len(p.excluded_gpus) == 1 and "4 KV heads" in p.excluded_gpus[0]["reason"]
    assert p.env["CUDA_VISIBLE_DEVICES"] == "0,1"


def _eight(p):
    # 8 divides 24 heads and 16/48 GDN heads; 4 KV heads are replicated (1 per rank).
    assert p.tensor_parallel_size == 8 and p.num_speculative_tokens == 4
    assert p.memory.kv_bytes_per_token == 17 * 2 * 1 * 256 * 1      # 17 layers, K+V, 1 head, fp8
    assert p.memory.block_size < 1024                                 # GDN state per rank is 1/8


def _six(p):
    assert p.tensor_parallel_size == 4
    assert sorted(e["index"] for e in p.excluded_gpus) == [4, 5]
    assert all("TP=6 is illegal" in e["reason"] for e in p.excluded_gpus)


def _mixed_arch(p):
    # Three 2080 Ti (TP=2) beat one 3090 (TP=1); the 3090 is listed with the mixing reason.
    assert p.gpu_name == "NVIDIA GeForce RTX 2080 Ti" and p.tensor_parallel_size == 2
    by_index = {e["index"]: e["reason"] for e in p.excluded_gpus}
    assert "never mixes architectures" in by_index[0] and "3090" in by_index[0]
    assert len(by_index) == 2


def _mixed_mem(p):
    assert p.tensor_parallel_size == 2 and p.memory.gpu_total_gib == 22.0
    assert sorted(e["index"] for e in p.excluded_gpus) == [2, 3]


def _desktop(p, reference_util=0.9):
    # GPU 0 has a desktop on it: free memory decides, and 0.5 GiB more is kept back.
    assert p.memory.outside_budget_mib.shared_gpu_headroom_mib == 512
    assert p.gpu_memory_utilization < 0.9
    assert p.tensor_parallel_size == 4


def _h200(p):
    # bf16 27B on 140 GiB: ~51 GiB weights, ~80 GiB of KV; 262144 x 17 x 2048 B (fp8, 4 KV heads).
    assert (p.tensor_parallel_size, p.dtype, p.attention_backend) == (1, "bfloat16", "FLASH_ATTN")
    assert p.num_speculative_tokens == 3 and p.gdn_prefill_backend == "triton"
    assert 45 <= p.memory.weights_gib <= 56
    assert 70 <= p.memory.kv_cache_gib <= 90
    assert p.memory.kv_bytes_per_token == 17 * 2 * 4 * 256
    assert p.max_model_len == 262144 and p.max_num_seqs >= 4
    assert "--disable-custom-all-reduce" not in p.vllm_args
    # the real model serves images: its API server imports the model class (CUDA), so vLLM's spawn stays
    assert "--language-model-only" not in p.vllm_args and "VLLM_WORKER_MULTIPROC_METHOD" not in p.env
    assert "--chat-template" not in p.vllm_args          # the model's own template, found as vLLM finds it


def _h200_x2(p):
    assert p.tensor_parallel_size == 2 and "--disable-custom-all-reduce" not in p.vllm_args
    assert 20 <= p.memory.weights_gib <= 28


def _tp_override(p):
    assert p.tensor_parallel_size == 2 and len(p.excluded_gpus) == 2
    assert any(r.startswith("TP=2: set by") for r in p.reasons)


def _mtp_zero(p):
    assert p.num_speculative_tokens == 0
    assert "--speculative-config" not in p.vllm_args
    # Without spec tokens the conv state is 3 columns, not 7: a smaller state page, so smaller blocks.
    assert p.memory.block_size < 1616


def _no_mtp_model(p):
    assert p.num_speculative_tokens == 0 and "MTP=0: the model has no MTP head." in p.reasons
    assert p.memory.kv_cache_groups.attention == 1
    assert p.memory.layers_per_pool_block == 16                     # 16 attention, no MTP layer


def _many_seqs_shrink(p):
    # 12 sequences cannot each reach 262144 tokens: the context shrinks and says so.
    assert p.max_num_seqs == 12
    assert 4096 <= p.max_model_len < 262144 and p.max_model_len % 256 == 0
    assert any("shrunk" in r for r in p.reasons)
    assert p.memory.kv_needed_gib <= p.memory.kv_cache_gib


def _bf16_on_turing(p):
    # 13 GiB of bf16 weights per GPU leave less KV than AWQ's 4.6 GiB do.
    assert p.tensor_parallel_size == 4 and p.quantization is None and p.dtype == "half"
    assert 11 <= p.memory.weights_gib <= 15
    assert p.memory.kv_cache_gib < 9


def _subset_visible(p):
    assert p.tensor_parallel_size == 2 and p.env["CUDA_VISIBLE_DEVICES"] == "1,3"
    hidden = {e["index"]: e["reason"] for e in p.excluded_gpus}
    assert hidden == {0: "not in CUDA_VISIBLE_DEVICES", 2: "not in CUDA_VISIBLE_DEVICES"}


def _uuid_visible(p):
    u = uuids("4x2080ti-22g")
    assert p.gpus == (u[2], u[3]) and p.env["CUDA_VISIBLE_DEVICES"] == "2,3"


def _eager(p):
    assert p.enforce_eager and p.cudagraph_capture_sizes == () and p.memory.cudagraph_gib == 0
    assert "--enforce-eager" in p.vllm_args and "--compilation-config" not in p.vllm_args


def _util_override(p):
    assert p.gpu_memory_utilization == 0.8
    assert abs(p.memory.requested_gib - 0.8 * 22.0) < 0.01


def _demo(p):
    assert p.demo and has_pair(p.vllm_args, "--load-format", "dummy")
    assert "--language-model-only" in p.vllm_args and "--limit-mm-per-prompt" not in p.vllm_args
    # the template file turingbox wrote: vLLM's API server then skips loading the AutoProcessor to find it
    assert has_pair(p.vllm_args, "--chat-template", os.path.join(p.model, "chat_template.jinja"))
    # text only: vLLM's API server never initialises CUDA, so the engine core is forked, not spawned
    assert p.env["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    assert any(r.startswith("engine core forked (VLLM_WORKER_MULTIPROC_METHOD=fork)") for r in p.reasons)
    assert p.memory.weights_breakdown_gib.vision == 0          # text-only: no vision tower


def _no_prefix(p):
    assert not p.prefix_caching and "--mamba-cache-mode" not in p.vllm_args
    assert "--no-enable-prefix-caching" in p.vllm_args


def _kv_auto(p):
    # A 16-bit KV cache doubles bytes per token.
    assert p.kv_cache_dtype == "auto" and p.memory.kv_bytes_per_token == 17 * 2 * 4 * 256 * 2


def _context_request(p):
    assert p.max_model_len == 32768 and p.max_num_seqs == 8       # sm_75 default cap fits at 32k


# The seed README's commands (2 and 4 cards): the user asked for 262144 tokens and 4 sequences.
SEED_COMMAND = {"max_num_seqs": 4, "max_num_batched_tokens": 8192, "max_model_len": 262144}


def _seed_readme_4(p):
    assert (p.tensor_parallel_size, p.num_speculative_tokens) == (4, 4)
    assert (p.max_model_len, p.max_num_seqs, p.max_num_batched_tokens) == (262144, 4, 8192)
    assert p.mtp_refused_parameters == ("min_p", "logit_bias")
    assert any(r.startswith("max_model_len=262144: requested; one sequence") for r in p.reasons)


def _seed_readme_2(p):
    # The case: the pool holds ~2 full contexts, not 4; vLLM starts because ONE fits.
    assert (p.tensor_parallel_size, p.max_model_len, p.max_num_seqs) == (2, 262144, 4)
    m = p.memory
    assert m.kv_needed_gib <= m.kv_cache_gib - m.kv_safety_margin_gib
    assert m.kv_all_seqs_at_max_len_gib > m.kv_cache_gib          # not all 4 at full length at once
    assert 262144 <= m.kv_cache_tokens < 4 * 262144
    r = next(r for r in p.reasons if r.startswith("max_model_len=262144"))
    assert "full-length sequence" in r and "share the pool" in r


def _many_seqs_share(p):
    # 256 sequences: the automatic context is conservative but stops at the 4096-token floor while
    # one 4096-token sequence fits; the rest share the pool.
    assert p.max_num_seqs == 256 and p.max_model_len == 4096
    assert any("share the pool" in r for r in p.reasons)


def _explicit_shrink(p):
    # 70 % of each card: one 262144-token sequence no longer fits, so (and only so) the context shrinks.
    assert p.max_model_len < 262144 and p.max_model_len % 256 == 0
    r = next(r for r in p.reasons if r.startswith(f"max_model_len={p.max_model_len} (shrunk by"))
    assert f"shrunk by {262144 - p.max_model_len} tokens" in r and "GiB more than" in r


def _latency_default(p):
    assert (p.tensor_parallel_size, p.data_parallel_size, p.num_speculative_tokens) == (4, 1, 4)
    assert p.objective == "latency" and "--data-parallel-size" not in p.vllm_args
    assert any(r.startswith("DP=1: TURINGBOX_OBJECTIVE=latency") and "2 replicas of TP=2" in r for r in p.reasons)


def _throughput_strict(p):
    # a dense model: vLLM runs its DP engines independently, each with its own strict warmup
    assert (p.tensor_parallel_size, p.data_parallel_size) == (2, 2) and p.plugin.strict_warmup
    assert has_pair(p.vllm_args, "--data-parallel-size", "2")
    assert any(r.startswith("DP=2:") and "its own strict warmup" in r for r in p.reasons)


def _throughput_moe_strict(p):
    # a MoE model's DP engines step in lockstep, which the strict warmup does not drive
    assert (p.tensor_parallel_size, p.data_parallel_size) == (4, 1)
    assert any("TURINGBOX_STRICT_WARMUP=0" in r and "MoE model (8 experts)" in r for r in p.reasons)


def _h100_dp8_strict(p):
    assert (p.tensor_parallel_size, p.data_parallel_size) == (1, 8) and p.plugin.strict_warmup
    assert any(r.startswith("DP=8:") and "its own strict warmup" in r for r in p.reasons)


def _throughput_dp(p):
    assert (p.tensor_parallel_size, p.data_parallel_size, p.num_speculative_tokens) == (2, 2, 3)
    assert has_pair(p.vllm_args, "--data-parallel-size", "2") and p.max_model_len == 262144
    assert list(p.gpus) == uuids("4x2080ti-22g") and p.excluded_gpus == ()
    assert any(r.startswith("DP=2:") for r in p.reasons)


def _h100_dp8(p):
    assert (p.tensor_parallel_size, p.data_parallel_size) == (1, 8)
    assert has_pair(p.vllm_args, "--data-parallel-size", "8") and p.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert not any("measured on an H200" in r for r in p.reasons)


def _h100_latency(p):
    assert (p.tensor_parallel_size, p.data_parallel_size) == (8, 1)
    assert any("TURINGBOX_OBJECTIVE=throughput would run 8 replicas of TP=1" in r for r in p.reasons)


def _throughput_set_tp(p):
    assert (p.tensor_parallel_size, p.data_parallel_size) == (2, 2) and p.excluded_gpus == ()


CASES = [
    ("seed-4x2080ti-22g-awq-262k", "4x2080ti-22g", "awq", {"max_model_len": 262144}, None, _seed),
    ("2x2080ti-22g-awq", "2x2080ti-22g", "awq", {}, None, _two),
    ("3x2080ti-22g-awq", "3x2080ti-22g", "awq", {}, None, _three),
    ("8x2080ti-22g-awq", "8x2080ti-22g", "awq", {}, None, _eight),
    ("6x2080ti-22g-awq", "6x2080ti-22g", "awq", {}, None, _six),
    ("mixed-2080ti-3090", "mixed-2080ti-3090", "awq", {}, None, _mixed_arch),
    ("mixed-22g-11g", "mixed-2080ti-22g-11g", "awq", {}, None, _mixed_mem),
    ("desktop-on-gpu0", "4x2080ti-22g-desktop", "awq", {}, None, _desktop),
    ("h200-bf16", "1xh200", "bf16", {}, None, _h200),
    ("2xh200-bf16", "2xh200", "bf16", {}, None, _h200_x2),
    ("tp-override-2", "4x2080ti-22g", "awq", {"tensor_parallel_size": 2}, None, _tp_override),
    ("mtp-override-0", "4x2080ti-22g", "awq", {"mtp": 0}, None, _mtp_zero),
    ("model-without-mtp", "4x2080ti-22g", "nomtp", {}, None, _no_mtp_model),
    ("many-seqs-shrink-context", "4x2080ti-22g", "awq", {"max_num_seqs": 12}, None, _many_seqs_shrink),
    ("bf16-27b-on-4x2080ti", "4x2080ti-22g", "bf16", {}, None, _bf16_on_turing),
    ("cuda-visible-subset", "4x2080ti-22g", "awq", {}, {"CUDA_VISIBLE_DEVICES": "3,1"}, _subset_visible),
    ("nvidia-visible-uuids", "4x2080ti-22g", "awq", {},
     {"NVIDIA_VISIBLE_DEVICES": ",".join(uuids("4x2080ti-22g")[2:])}, _uuid_visible),
    ("enforce-eager", "4x2080ti-22g", "awq", {"enforce_eager": True}, None, _eager),
    ("util-override", "4x2080ti-22g", "awq", {"gpu_memory_utilization": 0.8}, None, _util_override),
    ("demo-h200", "1xh200", "demo", {}, None, _demo),
    ("no-prefix-caching", "4x2080ti-22g", "awq", {"prefix_caching": False}, None, _no_prefix),
    ("h200-kv-auto", "1xh200", "bf16", {"kv_cache_dtype": "auto"}, None, _kv_auto),
    ("context-32k", "4x2080ti-22g", "awq", {"max_model_len": 32768}, None, _context_request),
    ("256-seqs-share-the-pool", "4x2080ti-22g", "awq", {"max_num_seqs": 256}, None, _many_seqs_share),
    ("seed-readme-4-cards", "4x2080ti-22g", "awq", SEED_COMMAND, None, _seed_readme_4),
    ("seed-readme-2-cards", "2x2080ti-22g", "awq", SEED_COMMAND, None, _seed_readme_2),
    ("explicit-len-shrinks-only-when-one-cannot-fit", "2x2080ti-22g", "awq",
     {"max_model_len": 262144, "gpu_memory_utilization": 0.7}, None, _explicit_shrink),
    ("len-at-the-request-bound", "4x2080ti-22g", "awq", {"max_model_len": 256, "mtp": 0}, None,
     lambda p: p.max_model_len == 256 or pytest.fail("256 tokens is one chat turn without MTP")),
    ("latency-default-keeps-tp4", "4x2080ti-22g", "awq", {}, None, _latency_default),
    ("throughput-dp-with-strict-warmup", "4x2080ti-22g", "awq", {"objective": "throughput"}, None,
     _throughput_strict),
    ("throughput-moe-waits-for-strict-warmup", "4x2080ti-22g", "moe", {"objective": "throughput"}, None,
     _throughput_moe_strict),
    ("throughput-8xh100-dp8-strict", "8xh100", "bf16", {"objective": "throughput"}, None, _h100_dp8_strict),
    ("throughput-dp2-tp2", "4x2080ti-22g", "awq", {"objective": "throughput", "strict_warmup": False}, None,
     _throughput_dp),
    ("throughput-8xh100-dp8", "8xh100", "bf16", {"objective": "throughput", "strict_warmup": False}, None,
     _h100_dp8),
    ("latency-8xh100-tp8", "8xh100", "bf16", {}, None, _h100_latency),
    ("throughput-with-set-tp", "4x2080ti-22g", "awq",
     {"objective": "throughput", "strict_warmup": False, "tensor_parallel_size": 2}, None, _throughput_set_tp),
]

ERROR_CASES = [
    ("stock-11g-cannot-hold-27b-awq", "1x2080ti-11g", "awq", {}, None, PlanError, ["does not fit", "GiB"]),
    ("2x11g-cannot-hold-27b-awq", "2x2080ti-11g", "awq", {}, None, PlanError, ["does not fit", "GiB"]),
    ("bf16-27b-on-one-2080ti", "1x2080ti-22g", "bf16", {}, None, PlanError, ["does not fit", "GiB"]),
    ("tp-3-illegal", "4x2080ti-22g", "awq", {"tensor_parallel_size": 3}, None, UsageError, ["--tensor-parallel-size/TURINGBOX_TP 3", "KV heads"]),
    ("tp-more-than-gpus", "4x2080ti-22g", "awq", {"tensor_parallel_size": 8}, None, UsageError, ["8", "4 identical"]),
    ("mtp-on-model-without-head", "4x2080ti-22g", "nomtp", {"mtp": 2}, None, UsageError, ["TURINGBOX_MTP 2", "no MTP head"]),
    ("mtp-out-of-range", "4x2080ti-22g", "awq", {"mtp": 9}, None, UsageError, ["TURINGBOX_MTP '9'"]),
    ("context-beyond-model", "4x2080ti-22g", "awq", {"max_model_len": 300000}, None, UsageError, ["300000", "262144"]),
    ("min-len-beyond-model", "1xh200", "bf16", {"min_model_len": 300000}, None, UsageError,
     ["--min-model-len/TURINGBOX_MIN_MODEL_LEN 300000", "the model's 262144-token context", "max_position_embeddings"]),
    ("min-len-above-asked-len", "1xh200", "bf16", {"min_model_len": 65536, "max_model_len": 32768}, None, UsageError,
     ["--min-model-len/TURINGBOX_MIN_MODEL_LEN 65536", "--max-model-len/TURINGBOX_MAX_MODEL_LEN 32768"]),
    ("len-below-one-chat-turn", "4x2080ti-22g", "awq", {"max_model_len": 1}, None, UsageError,
     ["--max-model-len/TURINGBOX_MAX_MODEL_LEN 1", "260 tokens", "4 MTP"]),
    ("len-below-one-chat-turn-no-mtp", "4x2080ti-22g", "awq", {"max_model_len": 255, "mtp": 0}, None, UsageError,
     ["TURINGBOX_MAX_MODEL_LEN 255", "256 tokens"]),
    ("util-0.1-named", "4x2080ti-22g", "awq", {"gpu_memory_utilization": 0.1}, None, PlanError,
     ["--gpu-memory-utilization/TURINGBOX_GPU_MEMORY_UTILIZATION 0.1", "2.20 GiB per GPU", "weights need"]),
    ("seqs-10000-named", "4x2080ti-22g", "awq", {"max_num_seqs": 10000}, None, PlanError,
     ["--max-num-seqs/TURINGBOX_MAX_NUM_SEQS 10000", "50000 tokens", "GiB"]),
    ("tp4-on-3-plus-1-kinds", "mixed-3x2080ti-3060", "awq", {"tensor_parallel_size": 4}, None, UsageError,
     ["--tensor-parallel-size/TURINGBOX_TP 4", "3x NVIDIA GeForce RTX 2080 Ti", "1x NVIDIA GeForce RTX 3060",
      "never mixes"]),
    ("objective-unknown", "4x2080ti-22g", "awq", {"objective": "fast"}, None, UsageError, ["TURINGBOX_OBJECTIVE"]),
    ("batched-below-decode-step", "4x2080ti-22g", "awq", {"max_num_batched_tokens": 2048, "max_num_seqs": 600},
     None, UsageError, ["--max-num-batched-tokens/TURINGBOX_MAX_NUM_BATCHED_TOKENS 2048", "600 x 5"]),
    ("bf16-on-sm75", "4x2080ti-22g", "awq", {"dtype": "bfloat16"}, None, UsageError, ["bfloat16", "sm_75"]),
    ("flash-attn-on-sm75", "4x2080ti-22g", "awq", {"attention_backend": "FLASH_ATTN"}, None, UsageError, ["FLASH_ATTN", "sm_80"]),
    ("flashinfer-fp8-half-on-sm90", "1xh200", "bf16", {"attention_backend": "FLASHINFER", "dtype": "half"}, None,
     UsageError, ["bfloat16", "sm_90"]),
    ("triton-fp8e4m3-on-sm75", "4x2080ti-22g", "awq", {"attention_backend": "TRITON_ATTN", "kv_cache_dtype": "fp8_e4m3"},
     None, UsageError, ["fp8_e5m2"]),
    ("gdn-flashinfer-on-sm75", "4x2080ti-22g", "awq", {"gdn_prefill_backend": "flashinfer"}, None, UsageError, ["sm_90"]),
    ("util-above-free", "4x2080ti-22g-desktop", "awq", {"gpu_memory_utilization": 0.99}, None, UsageError, ["GiB"]),
    ("batched-below-block", "4x2080ti-22g", "awq", {"max_num_batched_tokens": 512}, None, UsageError, ["512", "block"]),
    ("v100-unsupported", "1xv100", "awq", {}, None, PlanError, ["7.0", "7.5"]),
    ("no-gpu", "empty", "awq", {}, None, PlanError, ["--gpus-json/TURINGBOX_GPUS_JSON", "lists no GPU"]),
    ("all-hidden", "4x2080ti-22g", "awq", {}, {"CUDA_VISIBLE_DEVICES": ""}, PlanError, ["no GPU", "4 hidden"]),
    ("mig-refused", "4x2080ti-22g", "awq", {}, {"CUDA_VISIBLE_DEVICES": "MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"},
     PlanError, ["MIG"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_plan_table(models, case):
    _, inventory, model, settings, env, check = case
    plan = plan_for(models, inventory, model, env, **settings)
    check(plan)
    # Invariants of every plan.
    m = plan.memory
    assert m.kv_needed_gib <= m.kv_cache_gib - m.kv_safety_margin_gib + 0.001
    assert plan.reasons and all(r.strip().endswith(".") for r in plan.reasons)
    assert plan.vllm_args[:2] == ("serve", plan.model)
    assert has_pair(plan.vllm_args, "--tensor-parallel-size", str(plan.tensor_parallel_size))
    assert has_pair(plan.vllm_args, "--max-model-len", str(plan.max_model_len))
    assert has_pair(plan.vllm_args, "--worker-cls", "turingbox_plugin.worker.TuringboxWorker")
    extra = json.loads(plan.vllm_args[plan.vllm_args.index("--additional-config") + 1])
    assert extra["turingbox"] == plan.plugin.to_dict()
    ranks = plan.tensor_parallel_size * plan.data_parallel_size
    assert len(plan.gpus) == ranks and len(plan.env["CUDA_VISIBLE_DEVICES"].split(",")) == ranks
    assert plan.mtp_refused_parameters == (("min_p", "logit_bias") if plan.num_speculative_tokens else ())
    assert (plan.data_parallel_size > 1) == ("--data-parallel-size" in plan.vllm_args)
    mtp_cost = [r for r in plan.reasons if r.startswith("MTP cost:")]
    assert bool(mtp_cost) == bool(plan.num_speculative_tokens)
    assert all("min_p" in r and "logit_bias" in r and "TURINGBOX_MTP=0" in r for r in mtp_cost)
    # vLLM's start condition holds for every plan: one max_model_len sequence fits the planned pool.
    assert m.kv_cache_tokens >= plan.max_model_len
    assert plan.max_num_batched_tokens >= m.block_size            # align mode schedules whole blocks


@pytest.mark.parametrize("case", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_plan_refusals(models, case):
    _, inventory, model, settings, env, error, words = case
    with pytest.raises(error) as info:
        plan_for(models, inventory, model, env, **settings)
    text = str(info.value)
    assert "\n" not in text and text.endswith(".")
    for w in words:
        assert w in text, (w, text)


def test_eleven_gib_refusal_names_the_numbers(models):
    with pytest.raises(PlanError) as info:
        plan_for(models, "1x2080ti-11g", "awq")
    text = str(info.value)
    # AWQ 27B is ~18 GiB at TP=1 (4-bit layers + 16-bit embeddings, MTP and vision): far above 11 GiB.
    weights = float(text.split("weights need ")[1].split(" GiB")[0])
    assert 16 <= weights <= 21
    assert "11.0 GiB" in text


# ---- rules checked against vLLM 0.21's own arithmetic ---------------------------------------------

def test_legal_tp_follows_vllm_head_rules(models):
    m = models["bf16"]
    # 24 heads, 4 KV heads (split or replicate), 16/48 GDN heads, MLP 17408.
    assert legal_tps(m, 8) == [8, 4, 2, 1]
    assert "KV heads" in tp_problem(m, 3) and "KV heads" in tp_problem(m, 6)
    assert "attention heads" in tp_problem(m, 5)
    assert "attention heads" in tp_problem(m, 16)


def test_hybrid_page_arithmetic_matches_vllm_formula(models):
    m = models["bf16"]
    # platforms/interface.py _align_hybrid_block_size, TP=1, fp8 KV, K=3:
    #   attention page per token = 2 * 4 heads * 256 * 1 B = 2048
    #   mamba page = conv (10240 x (4-1+3)) * 2 B + ssm (48 x 128 x 128) * 4 B = 3,268,608
    #   block = 16 * ceil(3,268,608 / (16 * 2048)) = 1600; page = 1600 * 2048
    layout = mem.kv_layout(m, 1, 3, "fp8", "bfloat16", prefix_caching=True)
    conv = (2 * 16 * 128 + 48 * 128) * (4 - 1 + 3) * 2
    ssm = 48 * 128 * 128 * 4
    assert layout.state_page_bytes == conv + ssm
    assert layout.block_size == 16 * -(-(conv + ssm) // (16 * 2048))
    assert layout.page_bytes == layout.block_size * 2048 >= conv + ssm
    # 16 attention layers + 1 MTP layer vs 48 GDN layers: 48 >= 1.5 x 17, so groups of 17.
    assert (layout.group_size, layout.attention_groups, layout.state_groups) == (17, 1, 3)
    # align mode: 2 + K state blocks per GDN group per sequence.
    assert layout.blocks_per_request(1600 * 10) == 10 + 3 * (2 + 3)


def test_max_len_for_is_the_largest_that_fits(models):
    layout = mem.kv_layout(models["awq"], 4, 4, "fp8", "half", prefix_caching=True)
    for available in (3 * GIB, 7 * GIB + 12345, 13 * GIB):
        for seqs in (1, 3):
            n = layout.max_len_for(available, seqs)
            assert layout.bytes_for(n, seqs) <= available
            assert layout.bytes_for(n + layout.block_size, seqs) > available


def test_awq_weights_follow_modules_to_not_convert(models):
    awq = mem.weight_bytes_per_rank(models["awq"], 1, 2, include_vision=True)
    bf16 = mem.weight_bytes_per_rank(models["bf16"], 1, 2, include_vision=True)
    # Quantized layers: 4 bits + fp16 scale and 4-bit zero per 128 weights = 4.375 bits vs 16.
    assert 0.26 < awq.layers / bf16.layers < 0.30
    # Embeddings, lm_head, MTP and vision stay 16-bit under the seed's modules_to_not_convert.
    assert (awq.embeddings, awq.mtp, awq.vision) == (bf16.embeddings, bf16.mtp, bf16.vision)
    # Vocab-parallel: embeddings split across ranks.
    assert mem.weight_bytes_per_rank(models["awq"], 4, 2, True).embeddings * 4 == awq.embeddings


def test_capture_sizes_mirror_vllm_defaults():
    # config/vllm.py: max = min(max_num_seqs * (1+K) * 2, 512, max_num_batched_tokens)
    assert mem.cudagraph_capture_sizes(5, 4, 2048) == [1, 2, 4, 8, 16, 24, 32, 40, 48]
    sizes = mem.cudagraph_capture_sizes(256, 0, 8192)
    assert sizes[-1] == 512 and 256 in sizes and 272 in sizes
    assert mem.full_decode_sizes([1, 2, 4, 8, 16], 3) == [4, 8, 16]


def test_cache_key_is_stable_and_tracks_kernel_inputs(models):
    a = plan_for(models, "4x2080ti-22g", "awq")
    b = plan_for(models, "4x2080ti-22g", "awq")
    c = plan_for(models, "4x2080ti-22g", "awq", tensor_parallel_size=2)
    assert a.cache_key == b.cache_key != c.cache_key
    assert a.cache_inputs["plan"]["tensor_parallel_size"] == 4
    assert a.cache_inputs["software"]["vllm"] == "0.21.0"
    d = make_plan(read_inventory(fixture("4x2080ti-22g"), {}), models["awq"], plan_settings(),
                  dict(SOFTWARE, vllm="0.21.1"))
    assert d.cache_key != a.cache_key


def test_free_memory_drives_gpu_choice(models):
    # Two of three identical cards are used; the one with a desktop on it (less free) is left out.
    inv = json.loads(Path(fixture("3x2080ti-22g")).read_text())
    inv[0]["memory_free_mib"] = 20000
    from turingbox.gpus.inventory import gpu_from_dict
    gpus = [gpu_from_dict(g, "test") for g in inv]
    plan = make_plan(gpus, models["awq"], plan_settings(), SOFTWARE)
    assert plan.gpus == (inv[1]["uuid"], inv[2]["uuid"])
    assert plan.excluded_gpus[0]["index"] == 0


@pytest.mark.parametrize("name,cc", [("NVIDIA A10G", "8.6"), ("NVIDIA L4", "8.9"), ("NVIDIA H100 80GB HBM3", "9.0"),
                                     ("NVIDIA H200", "9.0")])
def test_mtp_reason_says_what_it_is_based_on(name, cc):
    from turingbox.gpus.inventory import Gpu
    from turingbox.plan import arch
    gpu = Gpu(0, "GPU-x", name, cc, 24000, 23000, "00000000:01:00.0")
    depth, reason = arch.mtp_depth(gpu, 1, True, None)
    assert depth == 3
    if "H200" in name:
        assert "measured on this GPU kind (H200" in reason
    else:
        assert "measured on an H200" not in reason and "no turingbox measurement" in reason and name in reason


def test_explicit_len_is_kept_exactly_when_one_sequence_fits(models):
    # Sweep gpu_memory_utilization on the seed's 2-card box: the requested 262144 stays whenever one
    # 262144-token sequence fits the usable pool, and the plan shrinks it only when it does not.
    inv = read_inventory(fixture("2x2080ti-22g"), {})
    for util in (0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9):
        try:
            p = make_plan(inv, models["awq"], plan_settings(SEED_COMMAND, gpu_memory_utilization=util), SOFTWARE)
        except PlanError:
            continue
        m = p.memory
        layout = mem.kv_layout(models["awq"], 2, p.num_speculative_tokens, "fp8", "half", True)
        usable = m.kv_cache_bytes - int(m.kv_safety_margin_gib * GIB)
        fits = layout.bytes_for(262144, 1) <= usable + GIB // 1000
        assert (p.max_model_len == 262144) == fits, (util, p.max_model_len)


def test_demo_fallback_field_defaults_to_none(models):
    assert plan_for(models, "4x2080ti-22g", "awq").demo_fallback is None


def test_prompt_logprobs_slices_fit_in_what_the_plan_keeps_outside_vllms_budget():
    # vLLM's memory profile never runs prompt logprobs; the plugin computes them in slices of at most
    # PROMPT_LOGPROBS_SLICE_MIB, which must fit in the post-KV slack every plan keeps outside the budget.
    from turingbox_plugin.vllm_fixes import PROMPT_LOGPROBS_BYTES_PER_ENTRY, PROMPT_LOGPROBS_SLICE_MIB, \
        prompt_logprobs_rows

    assert PROMPT_LOGPROBS_SLICE_MIB < mem.POST_KV_SLACK_MIB
    vocab = 248320                                   # Qwen3.6's vocabulary
    assert prompt_logprobs_rows(vocab) * vocab * PROMPT_LOGPROBS_BYTES_PER_ENTRY <= PROMPT_LOGPROBS_SLICE_MIB * mem.MIB


# ---- the least context, and the names vLLM answers to ------------------------------------------------------

def test_default_floor_is_no_refusal_below_it(models):
    """The declared min_model_len (4096) is a floor "at most what was asked": a shorter context still plans."""
    assert PlanSettings().min_model_len == 4096
    assert plan_for(models, "1xh200", "bf16", max_model_len=2048).max_model_len == 2048
    short = dataclasses.replace(models["bf16"], max_position_embeddings=2048)
    assert plan_for({"short": short}, "1xh200", "short").max_model_len == 2048
    # a floor someone set is checked against the model's own context
    with pytest.raises(UsageError, match="TURINGBOX_MIN_MODEL_LEN 3000 exceeds the model's 2048-token context"):
        plan_for({"short": short}, "1xh200", "short", min_model_len=3000)


def served_names(p) -> list[str]:
    """--served-model-name's values in the plan's vLLM argv (nargs='+': up to the next flag)."""
    i = p.vllm_args.index("--served-model-name") + 1
    names = []
    while i < len(p.vllm_args) and not p.vllm_args[i].startswith("--"):
        names.append(p.vllm_args[i])
        i += 1
    return names


def test_demo_answers_to_its_directory_and_to_demo(models):
    p = plan_for(models, "1xh200", "demo")
    assert p.served_model_name == "qwen-demo"             # the first name: responses, metrics, active warmup
    assert served_names(p) == ["qwen-demo", "demo"] == list(planner.served_model_names(p))
    assert any(r.startswith("served as qwen-demo and demo:") for r in p.reasons)
    named = plan_for(models, "1xh200", "demo", served_model_name="box")
    assert named.served_model_name == "box" and served_names(named) == ["box", "demo"]
    assert served_names(plan_for(models, "1xh200", "demo", served_model_name="demo")) == ["demo"]


def test_a_configured_model_answers_to_one_name(models):
    p = plan_for(models, "1xh200", "bf16")
    assert served_names(p) == ["qwen-bf16"] and not any(r.startswith("served as") for r in p.reasons)
    assert served_names(plan_for(models, "1xh200", "bf16", served_model_name="box")) == ["box"]


@pytest.mark.parametrize("text,experts", [
    ({}, 0), ({"num_experts": 64}, 64), ({"moe_num_experts": 16}, 16), ({"n_routed_experts": 256}, 256),
    ({"num_local_experts": 8}, 8), ({"num_experts": [32, 32]}, 32), ({"num_experts": None, "num_local_experts": 4}, 0),
    ({"block_configs": [{"block_type": "moe", "n_routed_experts": 128}, {"block_type": "attention"}]}, 128),
])
def test_num_experts_read_as_vllm_reads_them(text, experts):
    """ModelConfig.is_moe decides whether DP runs with the strict warmup; vLLM 0.21's get_num_experts is the rule."""
    from turingbox_plugin.contract import model_config_from_dict
    cfg = copy.deepcopy(architecture())
    cfg["text_config"].update(text)
    m = model_config_from_dict(cfg, "/m", "h")
    assert (m.num_experts, m.is_moe) == (experts, experts > 0)
