"""bench/pyspy_summary.py on py-spy 0.4.3's own output (tests/fixtures/pyspy-raw-threads.txt: `py-spy record
--threads --idle --subprocesses --rate 50 --format raw` of a script whose main thread computes while a thread named
"waiter" sleeps 1 s; the process line shortened). session.sh startupx records a warm turingbox start this way."""
import gzip
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
import pyspy_summary  # noqa: E402

FIXTURE = os.path.join(REPO, "tests", "fixtures", "pyspy-raw-threads.txt")


def test_each_thread_of_each_process_gets_its_seconds_and_top_functions():
    summary = pyspy_summary.summarize(pyspy_summary.read_stacks(FIXTURE), rate=50, top=3, min_s=0)
    by_thread = {g["thread"]: g for g in summary}
    # the one MainThread sample py-spy left unnamed counts with the named ones (89 samples at 50 Hz)
    assert set(by_thread) == {"MainThread (25936)", "waiter (25941)"}
    main, waiter = by_thread["MainThread (25936)"], by_thread["waiter (25941)"]
    assert main["seconds"] == 1.78 and main["process"] == "25936 python3 thr.py"
    assert waiter["seconds"] == 1.16            # --idle: the sleep is sampled too
    assert main["top"][0] == {"function": "<module> (thr.py)", "seconds": 1.74}
    assert [r["function"] for r in waiter["top"]] == ["Thread._bootstrap (threading.py)",
                                                     "Thread._bootstrap_inner (threading.py)", "Thread.run (threading.py)"]


def test_line_numbers_fold_into_one_row_per_function():
    assert pyspy_summary.function("_find_and_load (<frozen importlib._bootstrap>:1176)") == \
        "_find_and_load (<frozen importlib._bootstrap>)"


def test_the_cli_reads_gzip_writes_json_and_refuses_a_missing_file(tmp_path):
    gz = tmp_path / "p.txt.gz"
    with open(FIXTURE, "rb") as src, gzip.open(gz, "wb") as dst:
        dst.write(src.read())
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "pyspy_summary.py"), str(gz), "--min-s", "1.5",
                        "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("== 1.8 s  process 25936 python3 thr.py  thread MainThread")
    assert [g["thread"] for g in json.loads(out.read_text())] == ["MainThread (25936)"]     # waiter < 1.5 s
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "pyspy_summary.py"), str(tmp_path / "none.txt")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("pyspy_summary: cannot read") and "Traceback" not in r.stderr


def test_a_child_process_nested_under_its_parent_is_its_own_row():
    # py-spy 0.4.3 --subprocesses: `process PARENT:"";process CHILD:"cmd";thread (...)...` (a bench run of turingbox
    # serve over the stand-in vLLM on CPU; the child's command line shortened)
    path = os.path.join(REPO, "tests", "fixtures", "pyspy-raw-subprocess.txt")
    summary = pyspy_summary.summarize(pyspy_summary.read_stacks(path), rate=50, top=2, min_s=0)
    rows = {(g["process"].split()[0], g["thread"]): g for g in summary}
    assert set(rows) == {("770", "MainThread (770)"), ("748", "MainThread (748)"),
                         ("770", "Thread-5 (process_request_thread) (793)")}
    child = rows[("770", "MainThread (770)")]
    assert child["seconds"] == 1.5 and child["process"].startswith("770 python fake_vllm.py serve")
    assert child["top"][0] == {"function": "<module> (fake_vllm.py)", "seconds": 1.5}
    assert rows[("748", "MainThread (748)")]["seconds"] == 0.06


def test_tree_splits_a_functions_seconds_over_its_callees_in_one_process(tmp_path):
    """--tree on session 12's warm start (H200): the engine core's memory profile splits into vLLM's profile run
    and its CUDA-graph memory profile; a name in no stack is refused in one sentence."""
    path = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s12", "pyspy-warm.txt.gz")
    stacks = pyspy_summary.read_stacks(path)
    (root,) = pyspy_summary.tree(stacks, 50, "Worker.determine_available_memory", pid="4260", depth=1, min_s=0.5)
    assert root["seconds"] == 10.72
    children = {c["function"].split(" (")[0]: c for c in root["children"]}
    assert children["GPUModelRunner.profile_run"]["seconds"] == 8.06
    assert sum(c["seconds"] for c in root["children"]) <= root["seconds"]
    assert all(c["children"] == [] for c in root["children"])            # depth 1: one level below the function
    assert pyspy_summary.tree(stacks, 50, "Worker.determine_available_memory", pid="1", depth=2) == []
    r = subprocess.run([sys.executable, os.path.join(REPO, "bench", "pyspy_summary.py"), path, "--tree", "no_such_fn"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no stack" in r.stderr and "Traceback" not in r.stderr
