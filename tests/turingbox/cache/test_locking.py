"""Two and more real processes on one cache root: one writer per entry, never a corrupt entry."""
import json
import os
import signal
import subprocess
import sys
import time

from turingbox.cache import store
from tests.support.cache_helpers import make_plan, run_py, turingbox_temporaries
from tests.support.waiting import wait_until
from tests.support.plan_factory import cache_settings

# A child process: prepare the cache for the plan in argv, record what it got, write into the entry
# while holding it (appending start/end lines so overlapping writers would show), then finish and
# close, as serve and warmup do at exit.
CHILD = r"""
import json, os, sys, time
from turingbox import config
from turingbox.cache import store
plan, root, journal, hold = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
wait = float(sys.argv[5])
s = store.prepare_cache(plan, config.CacheSettings(cache_dir=root, cache_lock_wait=wait))
def note(what):
    with open(journal, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "what": what, "mode": s.mode, "result": s.status["result"],
                            "entry": s.entry}) + "\n")
note("start")
for i in range(5):
    p = os.path.join(s.env["TRITON_CACHE_DIR"], f"k{os.getpid()}_{i}.cubin")
    with open(p, "wb") as f:
        f.write(b"x" * 1000)
    time.sleep(hold / 5)  # behaviour: a writer that holds its entry for `hold` seconds
note("end")
s.finish(True)
s.close()
"""


def journal_lines(path):
    return [json.loads(line) for line in open(path)]


def start_child(plan, root, journal, hold, wait):
    return subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(plan), str(root), str(journal),
                             str(hold), str(wait)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_racing_writers_take_turns_and_leave_a_complete_entry(tmp_path, plan):
    journal = tmp_path / "journal"
    children = [start_child(plan, tmp_path / "root", journal, 0.5, 30) for _ in range(3)]
    for c in children:
        out, err = c.communicate(timeout=60)
        assert c.returncode == 0, err
    events = journal_lines(journal)
    assert all(e["mode"] == "shared" for e in events)
    # start/end pairs never interleave: a writer finishes before the next one starts
    for i in range(0, len(events), 2):
        assert events[i]["what"] == "start" and events[i + 1]["what"] == "end"
        assert events[i]["pid"] == events[i + 1]["pid"]
    assert [e["result"] for e in events[::2]] == ["miss", "hit", "hit"]
    entry = store.entry_dir(str(tmp_path / "root"), plan["cache_key"])
    assert store.entry_problems(entry, plan["cache_key"], deep=True) == []
    assert json.load(open(os.path.join(entry, "manifest.json")))["hits"] == 2


def test_busy_entry_gives_the_second_process_a_private_copy_and_leaves_the_writer_alone(tmp_path, plan,
                                                                                         private_tmpdir):
    journal = tmp_path / "journal"
    writer = start_child(plan, tmp_path / "root", journal, 4.0, 30)
    wait_until(lambda: journal.exists() and journal.read_text(), 20, what="the writer's start in the journal")
    reader = start_child(plan, tmp_path / "root", journal, 0.1, 0.2)
    out, err = reader.communicate(timeout=30)
    assert reader.returncode == 0, err
    reader_start = [e for e in journal_lines(journal) if e["pid"] == reader.pid][0]
    assert reader_start["mode"] == "private" and reader_start["result"] == "miss"
    assert not reader_start["entry"].startswith(str(tmp_path / "root"))
    assert reader_start["entry"].startswith(private_tmpdir)      # in the TMPDIR the child inherited...
    assert turingbox_temporaries(private_tmpdir) == []            # ...and gone once the reader exited
    assert writer.poll() is None  # the writer still holds its entry: the reader never touched it
    writer.communicate(timeout=30)
    assert writer.returncode == 0
    entry = store.entry_dir(str(tmp_path / "root"), plan["cache_key"])
    assert store.entry_problems(entry, plan["cache_key"], deep=True) == []
    kernels = os.listdir(os.path.join(entry, "triton"))
    # The writer's own files are there and the private reader's files never leaked into it.
    assert sum(k.startswith(f"k{writer.pid}_") for k in kernels) == 5
    assert not any(k.startswith(f"k{reader.pid}_") for k in kernels)


def test_writer_killed_mid_seed_releases_the_lock_and_the_next_start_resumes(tmp_path, plan):
    journal = tmp_path / "journal"
    writer = start_child(plan, tmp_path / "root", journal, 60.0, 30)
    wait_until(lambda: journal.exists() and journal.read_text(), 20, what="the writer's start in the journal")
    writer.send_signal(signal.SIGKILL)
    writer.communicate(timeout=10)
    t0 = time.monotonic()
    s = store.prepare_cache(plan, cache_settings(str(tmp_path / "root"), cache_lock_wait=30))
    assert time.monotonic() - t0 < 10  # the kernel released the dead writer's lock
    assert s.mode == "shared" and s.status["result"] == "miss"
    assert json.load(open(os.path.join(s.entry, "manifest.json")))["attempts"] == 2
    s.finish(True)
    assert store.prepare_cache(plan, cache_settings(str(tmp_path / "root"))).status["result"] == "hit"


def test_private_run_publishes_its_entry_when_the_shared_one_was_never_completed(tmp_path, plan, private_tmpdir):
    journal = tmp_path / "journal"
    writer = start_child(plan, tmp_path / "root", journal, 60.0, 30)
    wait_until(lambda: journal.exists() and journal.read_text(), 20, what="the writer's start in the journal")
    private = store.prepare_cache(plan, cache_settings(str(tmp_path / "root"), cache_lock_wait=0.2))
    assert private.mode == "private"
    open(os.path.join(private.env["TRITON_CACHE_DIR"], "mine.cubin"), "wb").write(b"warmed privately")
    writer.send_signal(signal.SIGKILL)  # the writer dies before completing its entry
    writer.communicate(timeout=10)
    private.finish(True)
    private.close()
    assert turingbox_temporaries(private_tmpdir) == []            # the published copy is not the private one
    entry = store.entry_dir(str(tmp_path / "root"), plan["cache_key"])
    assert store.entry_problems(entry, plan["cache_key"], deep=True) == []
    assert open(os.path.join(entry, "triton", "mine.cubin"), "rb").read() == b"warmed privately"
    assert store.prepare_cache(plan, cache_settings(str(tmp_path / "root"))).status["result"] == "hit"
