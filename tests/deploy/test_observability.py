"""The Grafana dashboard is what deploy/grafana/build.py builds with grafana-foundation-sdk, the alert rules pass
promtool (syntax and unit tests), and every series the dashboard, the alerts, KEDA and the endpoint picker read
is one that /metrics serves: turingbox's own (metrics.py) or vLLM's (the recorded 0.21 page)."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess

import yaml

from tests.deploy.deploy_helpers import (K8S, REPO, load, need, need_module, promql_series, turingbox_series, vllm_series)

GRAFANA = os.path.join(REPO, "deploy", "grafana")
ALERTS = os.path.join(REPO, "deploy", "prometheus", "alerts.yaml")


def build_module():
    spec = importlib.util.spec_from_file_location("grafana_build", os.path.join(GRAFANA, "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dashboard_exprs() -> list[str]:
    with open(os.path.join(GRAFANA, "turingbox.json")) as f:
        d = json.load(f)
    exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["query"].replace("label_values(", "").split(",")[0]
              for v in d["templating"]["list"] if v["type"] == "query"]
    return exprs


def alert_exprs() -> list[str]:
    with open(ALERTS) as f:
        return [r["expr"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]]


def known() -> set[str]:
    return turingbox_series() | vllm_series()


def test_committed_dashboard_is_the_built_one():
    need_module("grafana_foundation_sdk")
    mod = build_module()
    assert importlib.metadata.version("grafana-foundation-sdk") == mod.GRAFANA_SDK, "install the pinned SDK"
    with open(os.path.join(GRAFANA, "turingbox.json")) as f:
        committed = f.read()
    assert committed == mod.render(), "deploy/grafana/turingbox.json is stale: python3 deploy/grafana/build.py"


def test_dashboard_covers_what_operators_look_at():
    titles = {p["title"] for p in json.load(open(os.path.join(GRAFANA, "turingbox.json")))["panels"]}
    for t in ("Startup stage durations", "Ready", "JIT compiles after ready", "Time to first token",
              "Inter-token latency", "Tokens per second", "KV cache usage", "Requests running and waiting",
              "Draft acceptance rate", "GPU memory used"):
        assert t in titles, t


def test_every_series_queried_exists_on_metrics():
    exprs = dashboard_exprs() + alert_exprs()
    so = load(os.path.join(K8S, "components", "keda", "scaledobject.yaml"))[0]
    exprs += [t["metadata"]["query"] for t in so["spec"]["triggers"]]
    used = set().union(*(promql_series(e) for e in exprs))
    assert {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:time_to_first_token_seconds_bucket",
            "turingbox_jit_after_ready_total", "turingbox_ready"} <= used     # the extractor sees them at all
    missing = sorted(used - known())
    assert not missing, f"queried but not on /metrics: {missing}"


def test_the_series_the_endpoint_picker_reads_exist():
    # GIE's EPP defaults for vLLM (queue, KV usage; LoRA info only appears with --enable-lora)
    assert {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
            "vllm:cache_config_info"} <= vllm_series()


def test_the_name_check_can_fail():
    assert promql_series('sum(rate(vllm:no_such_total{a="b"}[5m])) by (x) / turingbox_ready') == \
        {"vllm:no_such_total", "turingbox_ready"}
    assert "vllm:no_such_total" not in known()


def test_alert_rules_pass_promtool():
    promtool = need("promtool")
    for args in (["check", "rules", ALERTS], ["test", "rules", os.path.join(REPO, "deploy", "prometheus", "alerts_test.yaml")]):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr


def test_prometheusrule_carries_the_same_rules_as_alerts_yaml():
    (rule,) = load(os.path.join(K8S, "components", "servicemonitor", "prometheusrule.yaml"))
    with open(ALERTS) as f:
        assert rule["spec"]["groups"] == yaml.safe_load(f)["groups"]


H200_PAGE = os.path.join(REPO, "docs", "data", "2026-12-01-h200-s6", "public-metrics-soak64-mid3.txt.gz")
# session 12: a seeded start's page (the startup series added in session 11), 64-layer demo, H200
H200_STARTUP_PAGE = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s12", "public-metrics-plmem.txt.gz")


def page_series(text: str) -> tuple[set[str], set[str]]:
    """(names with a sample, names only declared by # TYPE: a labelled counter with no child yet)."""
    import re
    samples = {re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", ln).group(0) for ln in text.splitlines() if ln and ln[0] != "#"}
    declared = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        declared |= {name, name + "_total"} if kind == "counter" else {name}
    return samples, declared - samples


def test_every_series_queried_is_on_the_h200_soak_page():
    """Issue 19's GPU check, kept: the public /metrics of `turingbox serve` on the H200 halfway through the soak
    (64-layer demo, 2026-12-01 session 6) serves every series the dashboard, the alerts and KEDA query; the
    startup series came later and are on session 12's page."""
    import gzip
    with gzip.open(H200_PAGE, "rt") as f:
        text = f.read()
    with gzip.open(H200_STARTUP_PAGE, "rt") as f:
        startup_text = f.read()
    samples, declared_only = page_series(text)
    startup_samples, startup_declared = page_series(startup_text)
    samples, declared_only = samples | startup_samples, declared_only | startup_declared
    exprs = dashboard_exprs() + alert_exprs()
    exprs += [t["metadata"]["query"] for t in load(os.path.join(K8S, "components", "keda", "scaledobject.yaml"))[0]
              ["spec"]["triggers"]]
    used = set().union(*(promql_series(e) for e in exprs))
    assert not sorted(used - samples - declared_only), "queried, not on the GPU run's /metrics"
    # under load: vLLM's series next to turingbox's, with requests running and KV in use
    values = {ln.split("{")[0].split(" ")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
              if ln and ln[0] != "#" and "{" in ln and "model_name=" in ln}
    assert values["vllm:num_requests_running"] > 0 and values["vllm:kv_cache_usage_perc"] > 0
    assert "vllm:time_to_first_token_seconds_bucket" in samples and "turingbox_ready" in samples


def test_the_startup_page_says_the_seeded_start_loaded_its_graphs():
    """Session 12's seeded start with the compile-key fix (H200): both graphs loaded, no mismatch."""
    import gzip
    with gzip.open(H200_STARTUP_PAGE, "rt") as f:
        lines = [ln for ln in f.read().splitlines() if ln and ln[0] != "#"]
    values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in lines}
    assert values["turingbox_startup_compile_cache_mismatch"] == 0
    assert values['turingbox_startup_vllm_graphs{source="loaded"}'] == 2
    assert values['turingbox_startup_vllm_graphs{source="compiled"}'] == 0
    assert values["turingbox_ready"] == 1

