#!/usr/bin/env python3
"""GPU machine: which of a soak's in-flight requests kills vLLM's engine (a device-side assert)?

Starts its own server from a plan (plain `vllm serve` with the plan's argv and plugins off, or `turingbox
serve`), sends the candidates (a JSON list of {"endpoint", "body"} from soak-*.jsonl) one at a time, checking
after each that the server still answers; a server that died is restarted and the search goes on, so every
single culprit is found. If no single request kills it, the whole set is sent at once and, when that kills
it, halves of the killing set are sent at once until the smallest killing group is left. Writes
$OUT/crash-bisect.json and vLLM's /metrics page of the first healthy server ($OUT/vllm-metrics.txt).
    python3 bench/gpu/crash_bisect.py --plan plan.json --candidates bench/gpu/crash_candidates.json
"""
import argparse, atexit, concurrent.futures as cf, contextlib, json, os, signal, subprocess, sys, time
import httpx
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak_gen import expand  # noqa: E402


class Server:
    """One server process for the search; restarted after a crash (after the gate, if any, is open)."""

    def __init__(self, a, plan: dict) -> None:
        self.a, self.plan, self.proc, self.starts, self.log = a, plan, None, 0, None
        self.model = a.model_name or plan.get("served_model_name") or plan["model"]

    def argv_env(self):
        a, plan = self.a, self.plan
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if a.mode == "turingbox":
            env["TURINGBOX_CACHE_DIR"] = a.cache
            return [sys.executable, "-m", "turingbox", "serve", "--model", plan["model"], "--port", str(a.port),
                    "--upstream-port", str(a.port + 1)], env
        from turingbox.engine.launch import plain_vllm_args
        args = plain_vllm_args(plan["vllm_args"])
        env.update(VLLM_PLUGINS="", VLLM_CACHE_ROOT=f"{a.cache}/vllm", TRITON_CACHE_DIR=f"{a.cache}/triton",
                   TORCHINDUCTOR_CACHE_DIR=f"{a.cache}/inductor", FLASHINFER_WORKSPACE_BASE=f"{a.cache}/flashinfer")
        for k, v in plan.get("env", {}).items():
            if v is not None and k != "CUDA_VISIBLE_DEVICES" and not k.startswith("TURINGBOX_"):
                env.setdefault(k, v)
        return [sys.executable, "-m", "vllm.entrypoints.cli.main", *args, "--host", "127.0.0.1",
                "--port", str(a.port)], env

    def gate(self) -> None:
        """Another lane's server may be measuring the device's free memory: wait until its KV line is logged."""
        if not self.a.gate_log:
            return
        t0 = time.time()
        while time.time() - t0 < self.a.gate_s:
            started = os.path.exists(self.a.gate_log)
            text = open(self.a.gate_log, errors="replace").read() if started else ""
            done = self.a.gate_done and os.path.exists(self.a.gate_done)
            if not started or done or "KV cache" in text or "exit" in text:
                return
            time.sleep(3)

    def start(self) -> float:
        self.gate()
        argv, env = self.argv_env()
        self.starts += 1
        self.log = os.path.join(self.a.out, f"bisect-{self.a.mode}-{self.starts}.log")
        t0 = time.time()
        self.proc = subprocess.Popen(argv, env=env, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        # plain vLLM: its /health; turingbox: the sidecar's readiness (session 25: "/ready" was a 404 it waited out)
        ready = "/health" if self.a.mode == "plain" else "/health/ready"
        with httpx.Client(base_url=self.url, trust_env=False) as c:
            while time.time() - t0 < self.a.ready_limit:
                if self.proc.poll() is not None:
                    self.stop()      # its engine core may outlive the API server
                    raise SystemExit(f"server exited rc={self.proc.returncode} during start; see {self.log}")
                try:
                    if c.get(ready, timeout=2).status_code == 200:
                        print(f"[{time.strftime('%T')}] server {self.starts} ready in {time.time() - t0:.0f} s",
                              flush=True)
                        return time.time() - t0
                except httpx.HTTPError:
                    pass
                time.sleep(1)
        # Session 23: a plain server left running here held 40 GiB through the next phases.
        self.stop()
        raise SystemExit(f"server not ready in {self.a.ready_limit} s; see {self.log}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.a.port}"

    def stop(self) -> None:
        """The whole process group, even when the API server has already exited (its engine core may not)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)    # what is left of the group
        self.proc.wait()
        time.sleep(3)   # let the driver hand the memory back before the next start measures it

    def crash_lines(self) -> list[str]:
        lines = open(self.log, errors="replace").read().splitlines()
        keys = ("Assertion", "device-side", "CUDA error", "Error", "Traceback", "File \"")
        return [ln[:300] for ln in lines if any(k in ln for k in keys)][-40:]


def leave_nothing_behind(srv: Server) -> None:
    """session.sh's `timeout` sends SIGTERM: on that and on any other way out, the server's group is stopped."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    atexit.register(srv.stop)


def alive(srv: Server) -> bool:
    try:
        r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model, "prompt": "hello", "max_tokens": 2},
                       timeout=60, trust_env=False)
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def send(srv: Server, cand: dict, seed: int):
    body = expand(cand["body"], seed)
    body["model"] = srv.model
    body.pop("stream", None); body.pop("stream_options", None)
    path = cand["endpoint"] if cand["endpoint"].startswith("/") else (
        "/v1/chat/completions" if cand["endpoint"] == "chat" else "/v1/completions")
    try:
        r = httpx.post(srv.url + path, json=body, timeout=300, trust_env=False)
        return r.status_code, r.text[:300]
    except httpx.HTTPError as exc:
        return 0, type(exc).__name__


def keys_of(cand: dict) -> list[str]:
    return sorted(k for k in cand["body"] if k not in ("messages", "prompt", "model"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True, help="`turingbox plan --json` output for the server")
    ap.add_argument("--candidates", required=True)
    ap.add_argument("--mode", choices=("plain", "turingbox"), default="plain")
    ap.add_argument("--port", type=int, default=8300)
    ap.add_argument("--cache", default="/tmp/bisect-cache")
    ap.add_argument("--model-name", default="", help="the served model name (default: the plan's)")
    ap.add_argument("--ready-limit", type=float, default=600)
    ap.add_argument("--gate-log", default="", help="before each start, wait until this log has a KV line")
    ap.add_argument("--gate-done", default="", help="... or this marker exists")
    ap.add_argument("--gate-s", type=float, default=600)
    ap.add_argument("--serving-marker", default="", help="touched when the first server is ready")
    ap.add_argument("--repeat", type=int, default=2, help="times the whole set is sent at once")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--no-restart", action="store_true", help="after a crash, record it and stop (one candidate)")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    plan, cands = json.load(open(a.plan)), json.load(open(a.candidates))
    for i, c in enumerate(cands):
        c.setdefault("id", i)
    srv = Server(a, plan)
    leave_nothing_behind(srv)
    result: dict = {"mode": a.mode, "singles": [], "culprits": [], "groups": []}

    def save():
        json.dump(result, open(os.path.join(a.out, f"crash-bisect-{a.mode}.json"), "w"), indent=1)

    result["ready_s"] = [srv.start()]
    if a.serving_marker:
        open(a.serving_marker, "w").close()
    try:
        alive(srv)
        with open(os.path.join(a.out, "vllm-metrics.txt"), "w") as f:
            f.write(httpx.get(srv.url + "/metrics", timeout=10, trust_env=False).text)
    except httpx.HTTPError:
        pass

    def restart(why: str) -> None:
        result.setdefault("crashes", []).append({"after": why, "log": srv.log, "lines": srv.crash_lines()})
        srv.stop()
        if not a.no_restart:
            result["ready_s"].append(srv.start())

    for cand in cands:
        t0 = time.time(); status, text = send(srv, cand, a.seed); ok = alive(srv)
        row = {"id": cand["id"], "endpoint": cand["endpoint"], "keys": keys_of(cand), "status": status,
               "text": text, "alive_after": ok, "s": round(time.time() - t0, 1)}
        result["singles"].append(row); print(json.dumps(row), flush=True); save()
        if not ok:
            result["culprits"].append(cand["id"])
            restart(f"single {cand['id']}")

    def group_kills(group: list[dict]) -> bool:
        with cf.ThreadPoolExecutor(len(group)) as pool:
            outs = list(pool.map(lambda x: send(srv, x, a.seed), group))
        ok = alive(srv)
        row = {"ids": [g["id"] for g in group], "statuses": [o[0] for o in outs], "alive_after": ok}
        result["groups"].append(row); print(json.dumps(row), flush=True); save()
        if not ok:
            restart(f"group {row['ids']}")
        return not ok

    if not result["culprits"]:
        killing = None
        for _ in range(a.repeat):
            if group_kills(cands):
                killing = list(cands)
                break
        while killing and len(killing) > 1:
            half = len(killing) // 2
            left, right = killing[:half], killing[half:]
            if group_kills(left):
                killing = left
            elif group_kills(right):
                killing = right
            else:
                break   # it takes members of both halves together
        if killing:
            result["killing_group"] = [{"id": c["id"], "keys": keys_of(c), "body": c["body"]} for c in killing]
    srv.stop()
    save()
    print(json.dumps({k: result.get(k) for k in ("culprits", "ready_s")}), flush=True)


if __name__ == "__main__":
    main()
