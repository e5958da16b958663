"""Plugin tools: `doctor`, `verify`, `check-model`, `bench decode|prefill`.

`register(sub)` adds them to the appliance's `turingbox` CLI; `main()` is the standalone
`turingbox-plugin` script for a plain vLLM environment with only the plugin installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from turingbox_plugin import check_model, contract, doctor, jit_report
from turingbox_plugin.bench.client import bench_decode, bench_prefill, plot_prefill
from turingbox_plugin.errors import ToolError


def _emit(data: Any, as_json: bool, text: str) -> None:
    print(json.dumps(data, indent=2, sort_keys=True, default=str) if as_json else text)


def _write_json(path: str | None, data: Any) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)


# -- doctor ---------------------------------------------------------------------------------------
def cmd_doctor(args: argparse.Namespace) -> int:
    checks = doctor.run_checks(args.model, args)
    result = doctor.as_json(checks)
    text = "\n".join(f"{c.status:4}  {c.name}: {c.detail}" for c in checks)
    _emit(result, args.json, text)
    return 0 if result["ok"] else 1


# -- verify ---------------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace) -> int:
    # the compile rows may import vLLM, whose logger writes to stdout: keep stdout the report (--json)
    # vLLM's logging variable, set before vLLM is imported
    contract.set_default_variable("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    # local: verify's kernels import Triton, and every `turingbox` command, serve too, registers this CLI (53 ms)
    from turingbox_plugin import verify

    if args.compile_only:
        rows = verify.compile_report(args.arch)
    else:
        if args.arch:
            raise ToolError("--arch is only meaningful with --compile-only (a GPU run uses the GPU's own arch).")
        rows = verify.run_on_gpu()
    ok = bool(rows) and all(r.get("ok") for r in rows)
    lines = []
    for r in rows:
        if "registers" in r or "error" in r and args.compile_only:
            lines.append(f"{'PASS' if r.get('ok') else 'FAIL'}  {r['name']}: shared {r.get('shared_bytes', '?')} B, "
                         f"registers {r.get('registers', '?')}, spills {r.get('spills', '?')}"
                         + (f" ({r['error']})" if r.get("error") else ""))
        else:
            lines.append(f"{'PASS' if r.get('ok') else 'FAIL'}  {r['name']}"
                         + (f": max abs err {r['max_abs_err']:.2e}" if "max_abs_err" in r else "")
                         + (f" ({r['error']})" if r.get("error") else ""))
    _emit({"ok": ok, "kernels": rows}, args.json, "\n".join(lines))
    return 0 if ok else 1


# -- check-model ----------------------------------------------------------------------------------
def cmd_check_model(args: argparse.Namespace) -> int:
    r = check_model.report(args.model_dir)
    tp = ", ".join(f"TP{t}: {v}" for t, v in r["tensor_parallel"].items())
    q = r["quantization"]
    text = "\n".join([
        f"model: {r['model']}",
        f"architecture: {r['architecture']}" + ("" if r["supported_architecture"] else " (not a tuned architecture)"),
        f"layers: {r['layers']} ({r['full_attention_layers']} full attention, {r['gdn_layers']} GDN)",
        f"MTP head: {r['mtp_layers']} layer(s)" if r["mtp_layers"] else "MTP head: none",
        f"quantization: {q['method']} {q['bits']}-bit group {q['group_size']}" if q else "quantization: none",
        f"heads: {r['heads']}",
        f"tensor parallel: {tp}",
    ] + [f"note: {n}" for n in r["notes"]])
    _emit(r, args.json, text)
    return 0


# -- bench ----------------------------------------------------------------------------------------
def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} must be at least 1")
    return v


def _lengths(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of token counts") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"{text!r} must list positive token counts")
    return vals


def cmd_bench_decode(args: argparse.Namespace) -> int:
    r = bench_decode(args.url, model=args.model, repeats=args.repeats, max_tokens=args.max_tokens,
                     api_key=args.api_key, timeout=args.timeout)
    _write_json(args.output, r)
    s = r["summary"]
    text = "\n".join([f"request {x['request']}: {x['completion_tokens']} tokens in {x['seconds']:.3f} s = "
                      f"{x['tok_per_s']:.1f} tok/s, {x['output_chars']} chars, sha256 {x['output_sha256'][:12]}"
                      for x in r["runs"]] +
                     [f"decode: mean {s['tok_per_s_mean']:.1f} tok/s, median {s['tok_per_s_median']:.1f} tok/s"])
    _emit(r, args.json, text)
    return 0


def cmd_bench_prefill(args: argparse.Namespace) -> int:
    r = bench_prefill(args.url, model=args.model, lengths=args.lengths, requests_per_length=args.requests,
                      api_key=args.api_key, timeout=args.timeout)
    if args.plot and len(r["lengths"]) >= 1:
        r["plot"] = plot_prefill(r, args.plot)
    _write_json(args.output, r)
    lines = [f"{p['tokens']:>6} tokens: TTFT median {p['ttft_median_s'] * 1000:.1f} ms, "
             f"P90 {p['ttft_p90_s'] * 1000:.1f} ms" for p in r["lengths"]]
    lines += [f"skipped {s['tokens']}: {s['reason']}" for s in r["skipped"]]
    if "fit" in r:
        f = r["fit"]
        lines.append(f"fit: TTFT = {f['overhead_s'] * 1000:.1f} ms + tokens / {f['prefill_tokens_per_s']:.0f} tok/s "
                     f"(R^2 {f['r2']:.4f})")
    _emit(r, args.json, "\n".join(lines))
    return 0


def _bench_common(p: argparse.ArgumentParser) -> None:
    defaults = contract.client_defaults()
    p.add_argument("--url", default=defaults["url"], help=f"server base URL [env {contract.BENCH_URL_ENV}]")
    p.add_argument("--model", default=None, help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=defaults["api_key"], help=f"bearer token [env {contract.API_KEY_ENV}]")
    p.add_argument("--timeout", type=float, default=600.0, help="per request timeout in seconds")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--output", default=None, help="also write the JSON result to this file")


def register(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check Python, torch, CUDA, Triton, ptxas, vLLM, GPUs, plugin, model")
    doctor.add_arguments(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("verify", help="plugin kernels vs references on a GPU, or --compile-only for an arch")
    p.add_argument("--compile-only", action="store_true", help="compile every plugin kernel without a GPU")
    p.add_argument("--arch", default=None, help="compute capability for --compile-only (default 7.5)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: cmd_verify(_default_arch(a)))

    p = sub.add_parser("check-model", help="static compatibility report of a model directory")
    p.add_argument("model_dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_check_model)

    p = sub.add_parser("jit-report", help="Triton compiles after ready vs warmup's: which argument was missed")
    p.add_argument("--runtime-dir", default=None, help="the workers' runtime dir (jit-keys-rank*.jsonl)")
    p.add_argument("--url", default="http://localhost:8000", help="or a running turingbox, to read it from the plan")
    p.add_argument("--api-key", default=None, help="bearer token for --url")
    p.add_argument("--json", action="store_true")
    p.add_argument("--output", default=None, help="also write the JSON report to this file")
    p.set_defaults(func=cmd_jit_report)

    p = sub.add_parser("bench", help="benchmarks against a running server")
    bsub = p.add_subparsers(dest="bench_command", metavar="BENCH")
    d = bsub.add_parser("decode", help="decode tok/s: non-streaming requests at concurrency 1")
    _bench_common(d)
    d.add_argument("--repeats", type=_positive, default=5)
    d.add_argument("--max-tokens", type=_positive, default=512)
    d.set_defaults(func=cmd_bench_decode)
    f = bsub.add_parser("prefill", help="TTFT vs prompt length, least-squares prefill speed, PNG plot")
    _bench_common(f)
    f.add_argument("--lengths", type=_lengths, default=(2048, 4096, 8192, 16384, 32768))
    f.add_argument("--requests", type=_positive, default=8, help="requests per length (the first is dropped)")
    f.add_argument("--plot", default=None, help="write a PNG plot here")
    f.set_defaults(func=cmd_bench_prefill)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def cmd_jit_report(args: argparse.Namespace) -> int:
    runtime_dir = args.runtime_dir
    if not runtime_dir:
        import httpx

        try:
            plan = httpx.get(args.url.rstrip("/") + "/turingbox/plan", timeout=10,
                             headers={"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}).json()
            runtime_dir = (plan.get("env") or {}).get(contract.RUNTIME_DIR_ENV)
        except (httpx.HTTPError, ValueError) as exc:
            raise ToolError(f"--url {args.url}: the plan could not be read ({type(exc).__name__}).") from None
        if not runtime_dir:
            raise ToolError(f"--url {args.url}: the plan names no {contract.RUNTIME_DIR_ENV}; give --runtime-dir.")
    if not os.path.isdir(runtime_dir):
        raise ToolError(f"--runtime-dir {runtime_dir!r} is not a directory.", 2)
    rep = jit_report.report(runtime_dir)
    print(json.dumps(rep, indent=2) if args.json else jit_report.format_text(rep))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rep, f, indent=2)
    return 1 if rep["after_ready_total"] else 0


def _default_arch(args: argparse.Namespace) -> argparse.Namespace:
    if args.compile_only and not args.arch:
        args.arch = "7.5"
    return args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="turingbox-plugin", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    register(sub)
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except ToolError as exc:
        print(f"turingbox-plugin: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
