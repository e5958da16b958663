#!/usr/bin/env python3
"""GPU machine: end-to-end greedy tokens with turingbox's GDN kernels vs vLLM's own (issue 6).

One process per mode (the layer substitution is process-wide), same weights, same prompts:

    python3 bench/gpu/gdn_e2e_greedy.py run --mode vllm  --model /tmp/demo4 --out $OUT/greedy-vllm.json
    python3 bench/gpu/gdn_e2e_greedy.py run --mode turbo --model /tmp/demo4 --out $OUT/greedy-turbo.json
    python3 bench/gpu/gdn_e2e_greedy.py compare $OUT/greedy-vllm.json $OUT/greedy-turbo.json

The demo model loads with dummy weights, which vLLM draws from U(-1e-3, 1e-3): logits then sit so close
together that argmax is decided by rounding noise. So after loading, every parameter of the target model
is redrawn from a fixed seed (matrices N(0, 0.02), vectors 1 + N(0, 0.02), the GDN gates A_log/dt_bias as
at initialisation; see redraw_weights), which gives logits with a realistic spread; both modes get
bit-identical weights. vLLM runs in-process (no engine-core subprocess, so apply_model runs the function
here), eager, with MTP speculative decoding so the turbo path's k+1-token decode kernel is the one
verifying drafts; greedy output does not depend on the drafts. The MTP head keeps its dummy weights, so
its drafts are mostly rejected: the result's `spec_decode` holds vLLM's acceptance counters, which say
whether steps with more than one accepted token were exercised at all. Prompts: short chats and one
2000-token prompt (prefilled through the tensor-core kernel; with the fp16 KV cache's ~800-token blocks,
align mode splits it into two block-aligned chunks, the second starting from a non-zero state).

`compare` prints the token match per prompt, the first divergence with the reference's top-1/top-2 logprob
margin there, and exits 1 if a prompt diverges where the reference's margin exceeds 0.05 nats (a flip
that rounding cannot explain).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def redraw_weights(model) -> int:
    """Redraw the target model's parameters in place from fixed seeds (identical in both modes).

    Matrices N(0, 0.02); norm weights 1 + N(0, 0.02); the GDN gates like the Mamba2/Qwen3-Next init
    (A = exp(A_log) ~ U(1, 16), softplus(dt_bias) ~ U(0.001, 0.1)): the per-token decay
    exp(-A * softplus(a + dt_bias)) then has a median of ~0.75 (quartiles ~0.15 / ~0.97), so the recurrent
    state carries context across tokens, prefill chunks and drafts. With A_log = dt_bias = 1 + noise the
    median decay is ~0.03: the state is forgotten within a token or two and a state-handling bug would
    barely move the tokens. Depthwise conv taps N(0, 0.5) (fan-in 4).
    In-place copies keep any tensor the drafter shares (embeddings, lm_head) shared.
    """
    import torch

    gen = torch.Generator(device="cuda")
    n = 0
    with torch.no_grad():
        for i, (name, p) in enumerate(sorted(model.named_parameters(), key=lambda kv: kv[0])):
            if not p.dtype.is_floating_point or p.dim() == 0 or name.endswith("_scale"):
                continue   # quantisation / KV scales (none in an unquantised model) keep their loaded value
            gen.manual_seed(1234 + i)
            if name.endswith("A_log"):
                u = torch.rand(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                value = torch.log(1.0 + 15.0 * u)
            elif name.endswith("dt_bias"):
                u = torch.rand(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                dt = 0.001 + 0.099 * u
                value = dt + torch.log(-torch.expm1(-dt))        # inverse softplus
            else:
                noise = torch.randn(p.shape, generator=gen, device=p.device, dtype=torch.float32)
                if "conv1d" in name:
                    value = noise * 0.5
                elif p.dim() >= 2:
                    value = noise * 0.02
                else:
                    value = 1.0 + noise * 0.02
            p.copy_(value.to(p.dtype))
            n += 1
    return n


def chat_token_ids(tok, text: str) -> list[int]:
    # transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True) unless return_dict=False.
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                  tokenize=True, return_dict=False)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = list(ids)
    if not ids or not all(isinstance(t, int) for t in ids):
        raise SystemExit(f"chat template gave no token ids for {text!r}: {ids!r:.200}")
    return ids


def spec_decode_counters(llm) -> dict:
    """vLLM's own spec-decode counters: whether drafts were ever accepted (num_accepted_tokens > 1 paths)."""
    try:
        metrics = llm.get_metrics()
    except Exception as exc:  # stats disabled or the reader changed
        return {"error": str(exc)}
    out = {}
    for m in metrics:
        if "spec_decode" in m.name:
            out[m.name] = getattr(m, "value", None) if not hasattr(m, "values") else list(m.values)
    return out


def run(args) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # the worker is this process: the hook applies to it
    os.environ["VLLM_PLUGINS"] = ""                      # the mode is chosen here, not by the plugin's plan
    os.environ["TURINGBOX_GDN"] = args.mode
    from turingbox_plugin.gdn import hook

    installed = hook.install(args.mode)
    status = hook.last_status()
    if args.mode == "turbo" and not installed:
        print(f"turbo path not installed: {status}", file=sys.stderr)
        return 1
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # Engine arguments as turingbox's plan sets them for this model (`turingbox plan --json`), minus what the
    # comparison does not need: prefix caching with --mamba-cache-mode align (what vLLM 0.21 picks with MTP;
    # it also splits the long prompt's prefill at a block boundary, so the second chunk starts from a
    # non-zero GDN state), the Triton/FLA GDN prefill (vLLM's default on sm_90 is FlashInfer's, whose JIT
    # build alone outlasts this script's timeout), the plan's 8192-token prefill chunk; eager, no fp8 KV.
    llm = LLM(model=args.model, load_format="dummy", enforce_eager=True, dtype=args.dtype, max_model_len=4096,
              max_num_seqs=8, max_num_batched_tokens=8192, gpu_memory_utilization=0.5,
              enable_prefix_caching=True, mamba_cache_mode="align", gdn_prefill_backend="triton", seed=0,
              speculative_config={"method": "mtp", "num_speculative_tokens": args.mtp} if args.mtp else None,
              limit_mm_per_prompt={"image": 0, "video": 0}, disable_log_stats=False)
    redrawn = llm.apply_model(redraw_weights)   # in-process executor: fn runs here on the worker, no pickling
    tok = llm.get_tokenizer()
    chats = ["What is the weather in Lisbon?", "Write a haiku about tensor cores.",
             "Explain the delta rule in one paragraph.", "List three prime numbers."]
    prompts = [TokensPrompt(prompt_token_ids=chat_token_ids(tok, c)) for c in chats]
    long_ids = list(tok.encode(" ".join(f"Section {i}: the keeper logs the tide and the wind." for i in range(170))))
    prompts.append(TokensPrompt(prompt_token_ids=long_ids[:2000]))
    sp = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=2, ignore_eos=True)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    gen_s = time.perf_counter() - t0
    result = {"mode": args.mode, "gdn_status": status, "dtype": args.dtype, "mtp": args.mtp,
              "params_redrawn": redrawn, "generate_s": gen_s, "spec_decode": spec_decode_counters(llm),
              "prompts": []}
    for o in outs:
        c = o.outputs[0]
        steps = []
        for tid, lp in zip(c.token_ids, c.logprobs or []):
            ranked = sorted(lp.values(), key=lambda x: x.rank)
            steps.append({"chosen_lp": lp[tid].logprob,
                          "top": [[k, v.logprob] for k, v in sorted(lp.items(), key=lambda kv: kv[1].rank)][:3],
                          "margin": (ranked[0].logprob - ranked[1].logprob) if len(ranked) > 1 else None})
        result["prompts"].append({"prompt_tokens": len(o.prompt_token_ids), "token_ids": list(c.token_ids),
                                  "steps": steps})
    json.dump(result, open(args.out, "w"))
    print(json.dumps({"mode": args.mode, "installed": installed, "generate_s": round(gen_s, 2),
                      "params_redrawn": redrawn, "spec_decode": result["spec_decode"],
                      "tokens": [len(p["token_ids"]) for p in result["prompts"]]}))
    return 0


def compare(args) -> int:
    ref, other = json.load(open(args.reference)), json.load(open(args.candidate))
    bad, report = 0, []
    if len(ref["prompts"]) != len(other["prompts"]) or not ref["prompts"]:
        print(f"prompt counts differ or are zero: {len(ref['prompts'])} vs {len(other['prompts'])}", file=sys.stderr)
        bad += 1
    for i, (a, b) in enumerate(zip(ref["prompts"], other["prompts"])):
        ta, tb = a["token_ids"], b["token_ids"]
        first = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        same = sum(x == y for x, y in zip(ta, tb))
        row = {"prompt": i, "prompt_tokens": a["prompt_tokens"], "tokens": len(ta), "identical_prefix": first
               if first is not None else len(ta), "match_frac": round(same / max(1, len(ta)), 3)}
        # Logprob agreement over the common prefix (same context on both sides).
        upto = first if first is not None else len(ta)
        diffs = [abs(sa["chosen_lp"] - sb["chosen_lp"]) for sa, sb in zip(a["steps"][:upto], b["steps"][:upto])]
        row["max_abs_logprob_diff_common_prefix"] = round(max(diffs), 4) if diffs else None
        if first is not None:
            margin = a["steps"][first]["margin"]
            row["ref_margin_at_divergence"] = margin
            if margin is None or margin > args.margin:
                bad += 1
                row["verdict"] = "divergence not explained by a near tie"
            else:
                row["verdict"] = "near tie"
        report.append(row)
        print(json.dumps(row))
    summary = {"reference": ref["mode"], "candidate": other["mode"], "prompts": len(report), "unexplained": bad,
               "reference_generate_s": round(ref["generate_s"], 2), "candidate_generate_s": round(other["generate_s"], 2)}
    print(json.dumps(summary))
    if args.json:
        json.dump({"summary": summary, "rows": report}, open(args.json, "w"), indent=1)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=("vllm", "turbo"), required=True)
    r.add_argument("--model", default="/tmp/demo4")
    r.add_argument("--dtype", default="float16")
    r.add_argument("--mtp", type=int, default=3)
    r.add_argument("--max-tokens", type=int, default=48)
    r.add_argument("--out", required=True)
    c = sub.add_parser("compare")
    c.add_argument("reference")
    c.add_argument("candidate")
    c.add_argument("--margin", type=float, default=0.05)
    c.add_argument("--json")
    args = ap.parse_args()
    return run(args) if args.cmd == "run" else compare(args)


if __name__ == "__main__":
    raise SystemExit(main())
