"""`turingbox cache show|verify` and `warmup --plan-json` input errors, as real subprocesses."""
import json
import os
import subprocess
import sys

from turingbox.cache import store
from tests.support.cache_fixtures import plan, private_tmpdir  # noqa: F401  (the cache tests' fixtures, by import)
from tests.support.cache_helpers import make_plan
from tests.turingbox.cache.test_session import seed
from tests.support.plan_factory import cache_settings


def cli(*args, root=None):
    env = {**os.environ}
    if root is not None:
        env["TURINGBOX_CACHE_DIR"] = str(root)
    return subprocess.run([sys.executable, "-m", "turingbox", *args],
                          capture_output=True, text=True, env=env, timeout=60)


def test_show_lists_entries_with_key_state_hits_and_sizes(tmp_path):
    a, b = make_plan(), make_plan(num_speculative_tokens=4)
    seed(a, tmp_path)
    store.prepare_cache(a, cache_settings(str(tmp_path))).finish(True)       # one hit
    store.prepare_cache(b, cache_settings(str(tmp_path))).finish(False)      # incomplete
    r = cli("cache", "show", root=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = {line.split()[0]: line.split() for line in r.stdout.splitlines()[2:]}
    assert lines[a["cache_key"]][1] == "yes" and lines[a["cache_key"]][3] == "1"
    assert lines[b["cache_key"]][1] == "no"
    j = json.loads(cli("cache", "show", "--json", root=tmp_path).stdout)
    rows = {e["key"]: e for e in j["entries"]}
    assert rows[a["cache_key"]]["sizes"]["triton"]["files"] == 2 and rows[a["cache_key"]]["complete"]
    assert not rows[b["cache_key"]]["complete"]


def test_verify_passes_sound_entries_and_fails_corrupt_ones(tmp_path):
    a, b = make_plan(), make_plan(tensor_parallel_size=2)
    sa, sb = seed(a, tmp_path), seed(b, tmp_path)
    ok = cli("cache", "verify", root=tmp_path)
    assert ok.returncode == 0 and "2 checked, 0 corrupt" in ok.stdout
    open(os.path.join(sb.entry, "triton", "abc", "__grp__kernel.json"), "w").write("{")  # truncated JSON
    bad = cli("cache", "verify", root=tmp_path)
    assert bad.returncode == 1
    assert f"{b['cache_key']}: CORRUPT" in bad.stdout and "__grp__kernel.json is not valid JSON" in bad.stdout
    assert f"{a['cache_key']}: ok" in bad.stdout
    only_a = cli("cache", "verify", a["cache_key"], "--json", root=tmp_path)
    assert only_a.returncode == 0 and json.loads(only_a.stdout)["entries"][a["cache_key"]]["ok"]


def test_verify_treats_an_incomplete_entry_as_a_miss_not_corruption(tmp_path):
    store.prepare_cache(make_plan(), cache_settings(str(tmp_path))).finish(False)
    r = cli("cache", "verify", root=tmp_path)
    assert r.returncode == 0 and "incomplete" in r.stdout


def test_bad_input_is_one_sentence_and_exit_2(tmp_path):
    missing = cli("cache", "show", root=tmp_path / "nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    seed(make_plan(), tmp_path)
    unknown = cli("cache", "verify", "0123456789abcdef", root=tmp_path)
    assert unknown.returncode == 2 and "No cache entry 0123456789abcdef" in unknown.stderr
    bad_wait = cli("warmup", "--plan-json", str(tmp_path / "x.json"), "--cache-lock-wait", "-1", root=tmp_path)
    assert bad_wait.returncode == 2 and "--cache-lock-wait" in bad_wait.stderr
    (tmp_path / "notaplan.json").write_text("[1, 2]")
    not_plan = cli("warmup", "--plan-json", str(tmp_path / "notaplan.json"), root=tmp_path)
    assert not_plan.returncode == 2 and "not a turingbox plan" in not_plan.stderr
    assert cli("cache", root=tmp_path).returncode == 2


def test_a_plan_saved_by_an_older_turingbox_is_refused_not_served_on_a_stale_entry(tmp_path):
    # cache key revision 1 (before session 11): its argv and key predate vLLM's HOME-free compile key
    from tests.support.plan_factory import planned
    saved = planned("1xh200").to_dict()
    del saved["cache_inputs"]["revision"]
    (tmp_path / "old.json").write_text(json.dumps(saved))
    r = cli("warmup", "--plan-json", str(tmp_path / "old.json"), root=tmp_path / "root")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert ("--plan-json '" + str(tmp_path / "old.json") + "' was planned by an older turingbox (cache key revision 1, "
            "this one is 2); write it again with `turingbox plan --json`.") in r.stderr
    assert not (tmp_path / "root").exists()                  # nothing half-written


def test_warmup_on_a_complete_entry_does_nothing_but_report_it(tmp_path):
    from tests.support.plan_factory import planned
    plan = make_plan()
    seed(plan, tmp_path / "root")
    # a whole plan (warmup --plan-json takes `turingbox plan --json`'s object) with this test's fingerprint
    saved = planned(cache_inputs=plan["cache_inputs"], cache_key=plan["cache_key"]).to_dict()
    (tmp_path / "plan.json").write_text(json.dumps(saved))
    r = cli("warmup", "--plan-json", str(tmp_path / "plan.json"), root=tmp_path / "root")
    assert r.returncode == 0, r.stderr
    stages = [l.split(": ", 1)[1].split()[0] for l in r.stdout.splitlines() if l.startswith("turingbox-stage: ")]
    assert stages == ["plan", "cache", "complete"]
    result = json.loads([l for l in r.stdout.splitlines() if l.startswith("turingbox-seed-result: ")][0].split(": ", 1)[1])
    assert result["cache_key"] == plan["cache_key"] and result["result"] == "hit"
    assert result["sizes"]["triton"]["files"] == 2
