"""Faults serve must survive, each with its outcome checked on real processes and real signals.

Already covered elsewhere (not repeated here; docs/reliability.md lists them):
tests/turingbox/serve/test_serve.py: test_upstream_death_mid_stream (one stream, clean error event, liveness 503,
exit != 0 with vLLM's last lines), test_upstream_hang_turns_readiness_503_and_back,
test_sigterm_drains_in_flight_then_stops_vllm (one stream), test_sigterm_during_startup_stops_vllm_and_exits_0
(loading), test_second_signal_forces_fast_exit, test_vllm_ignoring_sigterm_gets_sigkill;
tests/turingbox/cache/test_session.py: read-only / full volume / really full tmpfs run cold, corrupt entry quarantined
and rebuilt (four kinds of damage); tests/turingbox/cache/test_locking.py: racing writers on one volume.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.reliability.loadgen import one_request
from tests.support.sidecar_harness import pid_alive
from tests.support.waiting import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.timeout(90)


def fake_pid(s) -> int:
    return wait_until(lambda: s.events("started"), 10, what="the upstream to start")[0]["pid"]


async def stream_all(url: str, n_streams: int, max_tokens: int, timeout: float = 20.0,
                     received: dict[int, int] | None = None):
    """n concurrent chat streams; returns the raw body of each (or the exception's name). `received` (stream ->
    bytes so far) lets a caller wait until every stream is under way."""
    received = {} if received is None else received
    async with httpx.AsyncClient(base_url=url, timeout=timeout, trust_env=False,
                                 limits=httpx.Limits(max_connections=n_streams)) as client:
        async def one(i: int):
            body = {"model": "m", "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": str(i)}]}
            buf = bytearray()
            try:
                async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                    async for piece in r.aiter_raw():
                        buf += piece
                        received[i] = len(buf)
                return r.status_code, bytes(buf)
            except httpx.HTTPError as exc:
                return None, type(exc).__name__
        return await asyncio.gather(*(one(i) for i in range(n_streams)))


def test_upstream_killed_under_concurrent_streams(serve_factory):
    s = serve_factory(env={"FAKE_VLLM_CHUNK_DELAY": "0.05", "TURINGBOX_EXIT_LINGER_SECONDS": "2"})
    s.wait_ready()
    pid = fake_pid(s)

    async def scenario():
        received: dict[int, int] = {}
        streams = asyncio.create_task(stream_all(s.url, 16, 60, received=received))
        await asyncio.to_thread(wait_until, lambda: len(s.events("request")) >= 16, 10)
        # every stream is under way: each client has read its first chunks (60 chunks take 3 s each)
        deadline = asyncio.get_running_loop().time() + 10
        while not (len(received) == 16 and all(n > 0 for n in received.values())):
            assert asyncio.get_running_loop().time() < deadline, f"streams under way: {received}"
            await asyncio.sleep(0.01)  # poll: every stream's first chunks read, or the deadline
        os.kill(pid, signal.SIGKILL)
        plain = await asyncio.to_thread(s.client.post, "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        return await streams, plain

    results, plain = asyncio.run(scenario())
    for status, body in results:
        assert status == 200, body
        events = [e for e in body.decode().split("\n\n") if e]
        last_two = events[-2:]
        # A clean end: the error event saying why, then [DONE]; never a cut-off stream.
        assert last_two[1] == "data: [DONE]", events[-3:]
        err = json.loads(last_two[0][6:])
        assert "signal 9 (SIGKILL)" in err["error"]["message"], err
        seqs = [json.loads(e[6:])["fake_seq"] for e in events[:-2]]
        assert seqs == list(range(len(seqs))) and 0 < len(seqs) < 60        # in order, nothing lost before it
    assert plain.status_code in (502, 503)                                  # a new request is refused cleanly
    live = s.get("/health/live")
    assert live.status_code == 503 and "signal 9" in live.json()["reason"]
    assert s.wait_exit(20) == 1
    assert "vLLM exited unexpectedly with signal 9 (SIGKILL)" in s.output()


def test_upstream_hang_turns_readiness_503_within_the_probe_period(serve_factory):
    period = 1.0
    s = serve_factory(env={"TURINGBOX_UPSTREAM_PROBE_SECONDS": str(period)})
    s.wait_ready()
    hang = os.path.join(s.control, "hang")
    open(hang, "w").close()
    t0 = time.monotonic()
    try:
        wait_until(lambda: s.get("/health/ready").status_code == 503, 3 * period + 2, interval=0.05,
                   what="readiness 503 while vLLM hangs")
        took = time.monotonic() - t0
        # The next probe starts within one period and times out after one more.
        assert took <= 2 * period + 0.75, took
        assert s.get("/health/live").status_code == 200          # hung is not dead: no restart
        refused = s.client.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.headers["retry-after"]
    finally:
        os.unlink(hang)
    wait_until(lambda: s.get("/health/ready").status_code == 200, 3 * period + 2, what="readiness back")


def test_a_keepalive_connection_closed_by_vllm_does_not_turn_readiness_503(serve_factory):
    """Found on the GPU: vLLM's uvicorn closes idle keep-alive connections after 5 s, the probe period was 5 s
    too, and a probe written into a connection the server was closing made readiness 503 and refused users."""
    period = 0.3
    s = serve_factory(env={"TURINGBOX_UPSTREAM_PROBE_SECONDS": str(period), "FAKE_VLLM_KEEPALIVE_RACE": "1"})
    s.wait_ready()
    t_end = time.monotonic() + 8 * period
    while time.monotonic() < t_end:
        assert s.get("/health/ready").status_code == 200, s.output()[-1500:]
        time.sleep(period / 4)  # behaviour: readiness sampled four times a probe period, for eight periods
    assert "did not answer" not in s.output() and "/health failed" not in s.output()


def test_sigterm_during_planning_exits_0(serve_factory, tmp_path):
    fifo = str(tmp_path / "gpus.fifo")
    os.mkfifo(fifo)          # reading the inventory blocks until a writer comes: planning hangs
    s = serve_factory(gpus_json=fifo)
    wait_until(lambda: s.alive() and s.get("/health/ready").json()["stage"] == "planning", 20, what="planning")
    s.signal(signal.SIGTERM)
    assert s.wait_exit(10) == 0
    assert not s.events("started")                      # vLLM was never started
    assert "Traceback" not in s.output()


def test_sigterm_during_warmup_stops_vllm_and_exits_0(serve_factory):
    # Active warmup sends real requests; slow chunks keep serve in the warming stage.
    s = serve_factory(env={"TURINGBOX_ACTIVE_WARMUP": "1", "FAKE_VLLM_CHUNK_DELAY": "2", "FAKE_VLLM_CHILD": "1"})
    wait_until(lambda: s.alive() and s.get("/health/ready").json()["stage"] == "warming", 30, what="warming")
    wait_until(lambda: s.events("request"), 10, what="a warmup request")
    fake, child = fake_pid(s), s.events("child")[0]["child_pid"]
    t0 = time.monotonic()
    s.signal(signal.SIGTERM)
    assert s.wait_exit(20) == 0
    assert time.monotonic() - t0 < 10
    assert s.events("sigterm")
    assert not pid_alive(fake) and not pid_alive(child)
    assert "Traceback" not in s.output()


def test_sigterm_under_load_loses_no_accepted_request(serve_factory):
    """32 mixed requests in flight when SIGTERM comes: all finish whole, later ones are refused, exit 0."""
    s = serve_factory(env={"FAKE_VLLM_CHUNK_DELAY": "0.05", "TURINGBOX_DRAIN_GRACE_SECONDS": "20", "FAKE_VLLM_CHILD": "1"})
    s.wait_ready()
    fake = fake_pid(s)

    async def scenario():
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=s.url, timeout=30, limits=limits, trust_env=False) as client:
            rng = random.Random(5)
            accepted = [asyncio.create_task(one_request(client, i, rng, 30)) for i in range(32)]
            await asyncio.to_thread(wait_until, lambda: len(s.events("request")) >= 32, 10)
            s.signal(signal.SIGTERM)
            await asyncio.to_thread(wait_until, lambda: "received: draining" in s.output(), 10, what="draining")
            late = await one_request(client, 1000, rng, 3)
            return await asyncio.gather(*accepted), late

    results, late = asyncio.run(scenario())
    bad = [(r.kind, r.error) for r in results if not r.ok]
    assert not bad, bad                                      # every accepted request completed, chunk for chunk
    assert late.error is not None and ("HTTP 503" in late.error or "Connect" in late.error), late
    assert s.wait_exit(30) == 0
    assert s.events("sigterm")[0]["t"] >= max(e["t"] for e in s.events("completed"))   # vLLM stopped after them
    assert not pid_alive(fake)
    assert "drained: exiting" in s.output()


def _unwritable_dir(tmp_path) -> tuple[str, callable]:
    """A directory serve cannot write: read-only tmpfs when root may mount, else mode 0555 (non-root)."""
    d = tmp_path / "ro-cache"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        return str(d), lambda: d.chmod(0o755)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "turingbox-test", str(d)],
                      capture_output=True).returncode != 0:
        pytest.skip("running as root and cannot mount a read-only tmpfs")
    return str(d), lambda: subprocess.run(["umount", str(d)], check=False)


def test_read_only_cache_volume_serve_starts_warns_and_runs_cold(serve_factory, tmp_path):
    path, undo = _unwritable_dir(tmp_path)
    try:
        s = serve_factory(env={"TURINGBOX_CACHE_DIR": path})
        s.wait_ready()
        assert s.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        out = s.output()
        assert "WARNING" in out and "not writable" in out, out[-3000:]
        cache_line = [line for line in out.splitlines() if "turingbox.serve: cache {" in line]
        assert cache_line and json.loads(cache_line[0].split("cache ", 1)[1])["mode"] == "cold"
        assert s.temporaries()                      # the cold copy, in serve's TMPDIR...
        s.signal(signal.SIGTERM)
        assert s.wait_exit() == 0
        assert s.temporaries() == []                # ...removed at exit: restarts do not pile copies up
    finally:
        undo()


def test_full_cache_volume_serve_starts_warns_and_runs_cold(serve_factory, tmp_path):
    d = tmp_path / "full"
    d.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "turingbox-test", str(d)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        with open(d / "filler", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
            except OSError:
                pass
        s = serve_factory(env={"TURINGBOX_CACHE_DIR": str(d)})
        s.wait_ready()
        out = s.output()
        assert "WARNING" in out and "cold" in out, out[-3000:]
        s.signal(signal.SIGTERM)
        assert s.wait_exit() == 0
        assert s.temporaries() == []
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_corrupt_cache_entry_is_quarantined_and_rebuilt_by_serve(serve_factory, tmp_path):
    cache = str(tmp_path / "shared-cache")
    # An engine that writes compile artefacts (an entry is completed only then), then becomes the fake vLLM.
    env = {"TURINGBOX_CACHE_DIR": cache,
           "TURINGBOX_VLLM_COMMAND": f"{sys.executable} {REPO}/tests/support/engine_filling_caches.py"}
    first = serve_factory(env=env)
    first.wait_ready()
    key = first.get("/turingbox/plan").json()["cache_key"]
    entry = os.path.join(cache, "entries", key)
    wait_until(lambda: json.load(open(os.path.join(entry, "manifest.json"))).get("completed"), 10,
               what="the entry to be completed after ready")
    first.signal(signal.SIGTERM)
    assert first.wait_exit() == 0
    with open(os.path.join(entry, "manifest.json"), "w") as f:
        f.write('{"format": 1, "key": ')                          # torn write
    second = serve_factory(env=env)
    second.wait_ready()
    assert "quarantined" in second.output()
    quarantined = os.listdir(os.path.join(cache, "quarantine"))
    assert len(quarantined) == 1 and quarantined[0].startswith(key + "-")
    wait_until(lambda: json.load(open(os.path.join(entry, "manifest.json"))).get("completed"), 10,
               what="the rebuilt entry to be completed")
    second.signal(signal.SIGTERM)
    assert second.wait_exit() == 0
    third = serve_factory(env=env)
    third.wait_ready()
    line = [x for x in third.output().splitlines() if "turingbox.serve: cache {" in x][0]
    assert json.loads(line.split("cache ", 1)[1])["result"] == "hit"
