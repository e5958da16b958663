"""bench/import_profile.py gives each `-X importtime` line to the Python process that wrote it (the lines carry no
pid) and sums each process's imports. A small synthetic log: an API server, then an engine core and
multiprocessing's resource tracker that start together and interleave line by line, then a late import of the
API server after the engine is up. Every number below is fixed by the tree of each process."""
import gzip
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "bench", "import_profile.py")
sys.path.insert(0, os.path.join(REPO, "bench"))
import import_profile  # noqa: E402

HEADER = "import time: self [us] | cumulative | imported package"


def imp(self_us: int, cum_us: int, depth: int, name: str) -> str:
    return f"import time: {self_us:9d} | {cum_us:10d} | {'  ' * depth}{name}"


API, ENGINE, TRACKER = "API", "ENGINE", "TRACKER"
# (process, line): the file order. The engine core's and the tracker's stdlib lines interleave; only the
# sums (site = self + os + stat; vllm = self + torch) and "a young process loads a module once" tell them apart.
SCRIPT = [
    (API, HEADER),
    (API, imp(100, 100, 0, "encodings")),
    (API, imp(50, 50, 1, "os")),
    (API, imp(30, 30, 1, "stat")),
    (API, imp(20, 100, 0, "site")),
    (API, imp(600, 600, 2, "torch")),
    (API, imp(400, 1000, 1, "vllm")),
    (API, imp(0, 1000, 0, "vllm.entrypoints.cli")),
    (API, "(APIServer pid=10) INFO 12-02 05:06:54 [utils.py:240] non-default args: {}"),
    (API, imp(300, 300, 0, "vllm._aiter_ops")),
    (API, "(APIServer pid=10) INFO 12-02 05:07:00 [registry.py:134] running in text-only mode."),
] + [(None, "[W1202 05:07:01.803131052 socket.cpp:207] [c10d] a line no process can be told from")] * 60 + [
    # the API server waits for the engine core from here on: a process that wrote nothing for a while is
    # the last choice for a line that fits several processes
    (ENGINE, HEADER),
    (ENGINE, imp(11, 11, 0, "encodings")),
    (TRACKER, HEADER),
    (TRACKER, imp(13, 13, 0, "encodings")),
    (TRACKER, imp(8, 8, 1, "os")),
    (ENGINE, imp(7, 7, 1, "os")),
    (ENGINE, imp(3, 3, 1, "stat")),
    (TRACKER, imp(4, 4, 1, "stat")),
    (TRACKER, imp(6, 18, 0, "site")),
    (ENGINE, imp(5, 15, 0, "site")),
    (ENGINE, imp(3000, 3000, 2, "torch")),
    (TRACKER, imp(5, 5, 1, "multiprocessing")),
    (TRACKER, imp(4, 9, 0, "multiprocessing.resource_tracker")),
    (ENGINE, imp(2000, 5000, 1, "vllm")),
    (ENGINE, imp(0, 5000, 0, "vllm.entrypoints.cli")),
    (ENGINE, imp(700, 700, 0, "vllm.v1.worker.gpu_worker")),
    (ENGINE, "(EngineCore pid=20) INFO 12-02 05:07:16 [core.py:109] Initializing a V1 LLM engine (v0.21.0)"),
    (ENGINE, "(EngineCore pid=20) INFO 12-02 05:07:22 [registry.py:134] running in text-only mode."),
    (API, "(APIServer pid=10) INFO 12-02 05:08:28 [api_server.py:613] Supported tasks: ['generate']"),
    (API, imp(70, 70, 0, "vllm.entrypoints.serve.cache.api_router")),
    (API, "(APIServer pid=10) INFO:     Application startup complete."),
    (API, imp(5, 5, 0, "late.module")),
]
LINES = [line for _, line in SCRIPT]
WANT = {"APIServer pid=10": API, "EngineCore pid=20": ENGINE, "multiprocessing resource tracker": TRACKER}


def test_each_line_goes_to_the_process_that_wrote_it():
    procs, assigned = import_profile.attribute(LINES)
    assert len(procs) == 3
    names = {}
    for p in import_profile.profile(LINES)["processes"]:
        names[p["header_line"] - 1] = p["process"]
    # the process each import line was given, against the script's
    by_line = {no - 1: k for no, k, *_ in assigned}
    header_of = {}
    for i, (who, line) in enumerate(SCRIPT):
        if line == HEADER:
            header_of[who] = i
    index_of = {who: [p["header_line"] - 1 for p in procs].index(h) for who, h in header_of.items()}
    for i, (who, line) in enumerate(SCRIPT):
        if line.startswith("import time:") and line != HEADER:
            module = line.split("|")[-1].strip()
            assert by_line[i] == index_of[who], f"line {i + 1} ({module}) given to the wrong process"
    assert not any(a[6] for a in assigned), "every line fits its process's tree"
    assert {names[header_of[who]] for who in WANT.values()} == set(WANT)
    assert all(names[header_of[who]] == name for name, who in WANT.items())


def test_sums_per_process():
    r = import_profile.profile(LINES)
    p = {x["process"]: x for x in r["processes"]}
    api, engine, tracker = p["APIServer pid=10"], p["EngineCore pid=20"], p["multiprocessing resource tracker"]
    # totals are sums of the top-level (depth 0) cumulative times, in seconds
    assert api["total_import_s"] == round((100 + 100 + 1000 + 300 + 70 + 5) / 1e6, 6)
    assert api["after_ready_s"] == round(5 / 1e6, 6)
    assert engine["total_import_s"] == round((11 + 15 + 5000 + 700) / 1e6, 6)
    assert tracker["total_import_s"] == round((13 + 18 + 9) / 1e6, 6)
    assert [t["module"] for t in engine["top_level"][:2]] == ["vllm.entrypoints.cli", "vllm.v1.worker.gpu_worker"]
    assert engine["top_level"][0]["cumulative_s"] == 0.005   # seconds, to the microsecond
    assert engine["first_import_of"]["torch"] == {"cumulative_s": 0.003, "depth": 2, "under": "vllm.entrypoints.cli",
                                                  "line": 82}
    # self time per package is a partition of the process's time
    assert engine["self_time_by_package_s"]["torch"] == 0.003
    assert engine["self_time_by_package_s"]["vllm"] == round((2000 + 0 + 700) / 1e6, 6)
    assert round(sum(api["self_time_by_package_s"].values()), 6) == api["total_import_s"]
    assert api["import_lines"] == 10 and engine["import_lines"] == 8 and tracker["import_lines"] == 6
    assert all(x["inconsistent_lines"] == 0 for x in r["processes"])


def test_cli_reads_gz_and_writes_json(tmp_path):
    log = tmp_path / "serve.log.gz"
    with gzip.open(log, "wt") as f:
        f.write("\n".join(LINES) + "\n")
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, TOOL, str(log), "--json", str(out)], check=True, capture_output=True,
                   text=True, timeout=60)
    r = json.loads(out.read_text())
    assert [x["process"] for x in r["processes"]] == \
        ["APIServer pid=10", "EngineCore pid=20", "multiprocessing resource tracker"]


def test_a_log_without_importtime_lines_is_one_sentence(tmp_path):
    log = tmp_path / "plain.log"
    log.write_text("(APIServer pid=1) INFO 12-02 05:06:54 [utils.py:240] non-default args: {}\n")
    p = subprocess.run([sys.executable, TOOL, str(log)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "PYTHONPROFILEIMPORTTIME" in p.stderr and "Traceback" not in p.stderr


def test_session8_logs_attribute_cleanly():
    """The real logs: every vLLM process found, its lines consistent with one tree, and the totals near what
    docs/startup.md quotes."""
    data = os.path.join(REPO, "docs", "data", "2026-12-02-h200-s8")
    for name, api_s, engine_s in (("turingbox", 21.37, 20.93), ("plain", 19.75, 18.29)):
        with gzip.open(os.path.join(data, f"{name}-soak64.log.gz"), "rt") as f:
            r = import_profile.profile(f.read().splitlines())
        p = {x["process"].split(" pid=")[0]: x for x in r["processes"]}
        assert abs(p["APIServer"]["total_import_s"] - api_s) < 0.05
        assert abs(p["EngineCore"]["total_import_s"] - engine_s) < 0.05
        assert p["multiprocessing resource tracker"]["total_import_s"] < 0.1
        assert sum(x["inconsistent_lines"] for x in r["processes"]) <= 3
