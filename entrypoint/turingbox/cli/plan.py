"""`turingbox plan`: the plan for this machine's GPUs (or a --gpus-json inventory), as JSON or a readable table."""
from __future__ import annotations

import argparse
import json
import shlex
import sys

from turingbox import config
from turingbox.plan.from_settings import plan_from_settings
from turingbox.plan.planner import served_model_names
from turingbox.plan.types import Plan

GROUPS = ("plan", "demo")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "plan", help="print the vLLM plan for this machine's GPUs (or a --gpus-json inventory)",
        description="Choose tensor parallelism, MTP depth, memory sizing and vLLM arguments for the visible "
                    "GPUs and the model; print a table with the reasons, or the plan as JSON.")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    config.add_arguments(parser, config.PLAN_SETTINGS)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = config.load(args, groups=GROUPS)
    plan = plan_from_settings(settings.plan, settings.demo, write_demo=False)   # `plan` only reports: no model dirs
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(plan.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(format_table(plan))
    return 0


def format_table(plan: Plan) -> str:
    m = plan.memory
    rows = [
        ("model", f"{plan.model}" + ("  (demo)" if plan.demo else "")),
        ("served as", ", ".join(served_model_names(plan))),
        ("GPUs", f"{plan.tensor_parallel_size}x {plan.gpu_name} (sm_{plan.compute_capability.replace('.', '')}), "
                 f"CUDA_VISIBLE_DEVICES={plan.env['CUDA_VISIBLE_DEVICES']}"),
        ("tensor_parallel_size", plan.tensor_parallel_size),
        ("num_speculative_tokens", plan.num_speculative_tokens),
        ("dtype / quantization", f"{plan.dtype} / {plan.quantization or 'none'}"),
        ("load format", plan.load_format),
        ("attention / kv cache", f"{plan.attention_backend} / {plan.kv_cache_dtype}"),
        ("GDN prefill / path", f"{plan.gdn_prefill_backend} / {plan.gdn_path}"),
        ("max_model_len", plan.max_model_len),
        ("max_num_seqs", plan.max_num_seqs),
        ("max_num_batched_tokens", plan.max_num_batched_tokens),
        ("gpu_memory_utilization", plan.gpu_memory_utilization),
        ("per GPU (GiB)", f"weights {m.weights_gib:.2f}, activations {m.activation_gib:.2f}, "
                          f"CUDA graphs {m.cudagraph_gib:.2f}, KV cache {m.kv_cache_gib:.2f}"),
        ("KV cache", f"{m.kv_cache_tokens} tokens, block size {m.block_size}, "
                     f"{m.max_concurrency_at_max_len}x max_model_len"),
        ("CUDA graphs", "off (eager)" if plan.enforce_eager else
         f"{len(plan.cudagraph_capture_sizes)} sizes up to {max(plan.cudagraph_capture_sizes or [0])}"),
        ("cache_key", plan.cache_key),
    ]
    width = max(len(k) for k, _ in rows)
    out = ["turingbox plan", ""] + [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if plan.excluded_gpus:
        out += ["", "excluded GPUs:"] + [f"  - GPU {e['index']} {e['uuid']}: {e['reason']}" for e in plan.excluded_gpus]
    out += ["", "reasons:"] + [f"  - {r}" for r in plan.reasons]
    out += ["", "vllm " + " ".join(shlex.quote(a) for a in plan.vllm_args), ""]
    return "\n".join(out)
