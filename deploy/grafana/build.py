#!/usr/bin/env python3
"""Build deploy/grafana/turingbox.json with grafana-foundation-sdk (pinned: see GRAFANA_SDK below).

    python3 deploy/grafana/build.py            # write the JSON
    python3 deploy/grafana/build.py --check    # exit 1 when the committed JSON differs (CI: tests/deploy)

Every query reads series that `/metrics` on the public port serves: turingbox's own (turingbox_*) and vLLM's,
passed through from its loopback port (vllm:*). tests/deploy checks each name against
entrypoint/turingbox/serve/metrics.py and the recorded vLLM 0.21 page.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUTPUT = os.path.join(HERE, "turingbox.json")
GRAFANA_SDK = "1769699379!11.6.0"      # grafana-foundation-sdk for Grafana 11.6; the JSON depends on it

SEL = 'instance=~"$instance"'          # every query is narrowed to the chosen replicas
RATE = "$__rate_interval"


def build() -> dict:
    from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
    from grafana_foundation_sdk.models.common import LegendDisplayMode, LegendPlacement
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import (DashboardCursorSync, DataSourceRef, Threshold, ThresholdsMode,
                                                         VariableRefresh)

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")

    def q(expr: str, legend: str = "", ref: str = "A") -> prometheus.Dataquery:
        return prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").ref_id(ref).datasource(ds)

    def steps(*pairs) -> dashboard.ThresholdsConfig:
        """(value, color) pairs; the first value is None (the base color)."""
        return dashboard.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
            [Threshold(value=v, color=c) for v, c in pairs])

    def ts(title: str, unit: str, *queries, desc: str = "", w: int = 12, h: int = 8, max_val=None):
        p = (timeseries.Panel().title(title).description(desc).unit(unit).datasource(ds).span(w).height(h)
             .legend(common.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST)
                     .placement(LegendPlacement.BOTTOM)))
        if max_val is not None:
            p = p.min(0).max(max_val)
        for i, query in enumerate(queries):
            p = p.with_target(query.ref_id(chr(ord("A") + i)))
        return p

    def st(title: str, unit: str, query, thresholds=None, desc: str = "", w: int = 4, h: int = 4):
        p = stat.Panel().title(title).description(desc).unit(unit).datasource(ds).span(w).height(h).with_target(query)
        if thresholds is not None:
            p = p.thresholds(thresholds)
        return p

    def quantiles(metric: str, title: str, desc: str):
        return ts(title, "s", *(q(f"histogram_quantile({p}, sum by (le) (rate({metric}_bucket{{{SEL}}}[{RATE}])))",
                                  f"p{int(p * 100)}") for p in (0.5, 0.95, 0.99)), desc=desc, w=8)

    d = (dashboard.Dashboard("turingbox").uid("turingbox").tags(["turingbox", "vllm"])
         .description("turingbox appliance: startup, readiness, JIT after ready, vLLM latency, throughput, KV cache, "
                      "queue, MTP acceptance and GPUs. One scrape of the sidecar's /metrics carries both turingbox_* "
                      "and vLLM's own vllm:* series.")
         .refresh("30s").time("now-3h", "now").timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(dashboard.QueryVariable("instance").label("replica").datasource(ds)
                        .query("label_values(turingbox_ready, instance)").refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
                        .multi(True).include_all(True).all_value(".*")))

    d = d.with_row(dashboard.Row("Startup and readiness"))
    d = d.with_panel(st("Ready", "none", q(f"turingbox_ready{{{SEL}}}", "{{instance}}"),
                        steps((None, "red"), (1, "green")), desc="1 when /health/ready answers 200"))
    d = d.with_panel(st("Seconds to ready", "s", q(f"turingbox_startup_seconds{{{SEL}}}", "{{instance}}"),
                        desc="From process start to ready, last start of each replica"))
    d = d.with_panel(st("JIT compiles after ready", "none",
                        q(f"sum by (instance) (turingbox_jit_after_ready_total{{{SEL}}})", "{{instance}}"),
                        steps((None, "green"), (1, "red")),
                        desc="Kernel compilations after ready, all ranks (should stay 0: each is a user-facing stall)"))
    d = d.with_panel(st("Warmup passed", "none", q(f"min by (instance) (turingbox_warmup_ok{{{SEL}}})", "{{instance}}"),
                        steps((None, "red"), (1, "green")), desc="1 when every rank's strict warmup passed"))
    d = d.with_panel(st("vLLM metrics fetch errors", "none",
                        q(f"sum(increase(turingbox_upstream_metrics_scrape_errors_total{{{SEL}}}[$__range]))"),
                        steps((None, "green"), (1, "orange")),
                        desc="Scrapes of /metrics that came without vLLM's series (vLLM slow, down or malformed)"))
    d = d.with_panel(st("Upstream errors", "none",
                        q(f"sum(increase(turingbox_upstream_errors_total{{{SEL}}}[$__range]))"),
                        steps((None, "green"), (1, "orange")), desc="Failures talking to vLLM on the /v1 proxy"))
    d = d.with_panel(ts("Startup stage durations", "s",
                        q(f"max by (stage) (turingbox_startup_stage_seconds{{{SEL}}})", "{{stage}}"),
                        desc="Seconds each startup stage took (the current one so far)", w=12))
    d = d.with_panel(ts("JIT compiles after ready, by kernel", "none",
                        q(f"sum by (kernel, rank) (increase(turingbox_jit_after_ready_by_kernel_total{{{SEL}}}[{RATE}]))",
                          "{{kernel}} rank {{rank}}"), w=12))

    d = d.with_row(dashboard.Row("Latency"))
    d = d.with_panel(quantiles("vllm:time_to_first_token_seconds", "Time to first token",
                               "vLLM's TTFT histogram, all replicas"))
    d = d.with_panel(quantiles("vllm:inter_token_latency_seconds", "Inter-token latency",
                               "vLLM's ITL histogram (with MTP one step may yield several tokens)"))
    d = d.with_panel(quantiles("vllm:e2e_request_latency_seconds", "End-to-end request latency",
                               "vLLM's e2e histogram"))
    d = d.with_panel(ts("Sidecar overhead (p99)", "s",
                        q(f"histogram_quantile(0.99, sum by (le) (rate(turingbox_proxy_overhead_seconds_bucket{{{SEL}}}[{RATE}])))",
                          "p99"), desc="Time the sidecar adds before a request reaches vLLM", w=12))
    d = d.with_panel(ts("Requests by status", "reqps",
                        q(f"sum by (code) (rate(turingbox_proxy_requests_total{{{SEL}}}[{RATE}]))", "{{code}}"), w=12))

    d = d.with_row(dashboard.Row("Throughput, queue and KV cache"))
    d = d.with_panel(ts("Tokens per second", "short",
                        q(f"sum(rate(vllm:generation_tokens_total{{{SEL}}}[{RATE}]))", "generated"),
                        q(f"sum(rate(vllm:prompt_tokens_total{{{SEL}}}[{RATE}]))", "prompt"), w=8))
    d = d.with_panel(ts("Requests running and waiting", "short",
                        q(f"sum by (instance) (vllm:num_requests_running{{{SEL}}})", "running {{instance}}"),
                        q(f"sum by (instance) (vllm:num_requests_waiting{{{SEL}}})", "waiting {{instance}}"),
                        desc="vllm:num_requests_waiting is what the KEDA component scales on", w=8))
    d = d.with_panel(ts("KV cache usage", "percentunit",
                        q(f"max by (instance) (vllm:kv_cache_usage_perc{{{SEL}}})", "{{instance}}"),
                        desc="Fraction of KV blocks in use (alert above 95 %)", w=8, max_val=1))
    d = d.with_panel(ts("Prefix cache hit rate", "percentunit",
                        q(f"sum(rate(vllm:prefix_cache_hits_total{{{SEL}}}[{RATE}])) / "
                          f"sum(rate(vllm:prefix_cache_queries_total{{{SEL}}}[{RATE}]))", "hit rate"), w=12, max_val=1))
    d = d.with_panel(ts("Preemptions", "short",
                        q(f"sum(rate(vllm:num_preemptions_total{{{SEL}}}[{RATE}]))", "preemptions/s"), w=12))

    d = d.with_row(dashboard.Row("Speculative decoding (MTP)"))
    d = d.with_panel(ts("Draft acceptance rate", "percentunit",
                        q(f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[{RATE}])) / "
                          f"sum(rate(vllm:spec_decode_num_draft_tokens_total{{{SEL}}}[{RATE}]))", "accepted / drafted"),
                        w=8, max_val=1))
    d = d.with_panel(ts("Mean acceptance length", "short",
                        q(f"1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{{{SEL}}}[{RATE}])) / "
                          f"sum(rate(vllm:spec_decode_num_drafts_total{{{SEL}}}[{RATE}]))", "tokens per step"),
                        desc="Tokens produced per target-model step (1 = no draft accepted)", w=8))
    d = d.with_panel(ts("Acceptance by draft position", "percentunit",
                        q(f"sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{{{SEL}}}[{RATE}])) "
                          f"/ scalar(sum(rate(vllm:spec_decode_num_drafts_total{{{SEL}}}[{RATE}])))", "position {{position}}"),
                        w=8, max_val=1))

    d = d.with_row(dashboard.Row("GPUs"))
    d = d.with_panel(ts("GPU memory used", "bytes",
                        q(f"turingbox_gpu_memory_used_bytes{{{SEL}}}", "{{instance}} GPU {{index}}"),
                        q(f"turingbox_gpu_memory_total_bytes{{{SEL}}}", "{{instance}} GPU {{index}} total"), w=12))
    d = d.with_panel(ts("GPU utilization", "percentunit",
                        q(f"turingbox_gpu_utilization_ratio{{{SEL}}}", "{{instance}} GPU {{index}}"), w=12, max_val=1))
    d = d.with_panel(ts("GPU power", "watt", q(f"turingbox_gpu_power_watts{{{SEL}}}", "{{instance}} GPU {{index}}")))
    d = d.with_panel(ts("GPU temperature", "celsius",
                        q(f"turingbox_gpu_temperature_celsius{{{SEL}}}", "{{instance}} GPU {{index}}")))

    return json.loads(json.dumps(d.build(), cls=JSONEncoder, sort_keys=True))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description="build the turingbox Grafana dashboard")
    ap.add_argument("--check", action="store_true", help="compare with the committed JSON instead of writing it")
    args = ap.parse_args()
    text = render()
    if args.check:
        with open(OUTPUT) as f:
            committed = f.read()
        if committed != text:
            sys.stdout.writelines(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                                       "turingbox.json (committed)", "turingbox.json (built)"))
            print("deploy/grafana/turingbox.json is stale: run python3 deploy/grafana/build.py", file=sys.stderr)
            return 1
        return 0
    with open(OUTPUT, "w") as f:
        f.write(text)
    print(f"wrote {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
