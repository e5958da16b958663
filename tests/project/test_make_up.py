"""`make up` (and `make down`/`make logs`) refuse before building anything when Docker cannot serve the appliance:
no docker CLI, no daemon answering, no Compose v2, no GPU or no NVIDIA runtime. Each refusal is one sentence
with its remedy (tools/up-check.sh) and exit 2.

These run the real `make` on the real Makefile and the real docker CLI. What the machine lacks or has is
arranged around them: DOCKER_HOST at a dead socket, or at a stand-in daemon (a unix socket answering the two
Engine API calls `docker info` makes, /_ping and /info, with the runtimes each case needs); a `docker` on
PATH in front of the real one that logs every call (and, for the "no Compose v2" case, answers `compose`
as a CLI without the plugin does); an `nvidia-smi` that lists a GPU or fails as without a driver.
"""
from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import socketserver
import subprocess
import threading

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
UP_CHECK = os.path.join(REPO, "tools", "up-check.sh")
MAKE_ERROR = re.compile(r"^make: \*\*\* \[Makefile:\d+: (\w+)\] Error (\d+)$")


def real_docker() -> str:
    path = shutil.which("docker")
    if path is None:
        pytest.skip("the docker CLI is not installed (make test-setup installs it)")
    return path


class _StandInDaemon(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler(runtimes: dict, requests: list):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _send(self, code: int, body: str, ctype: str = "application/json"):
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Api-Version", "1.41")
            self.send_header("Ostype", "linux")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            requests.append(f"{self.command} {path}")
            if path.endswith("/_ping"):
                return self._send(200, "OK", "text/plain")
            if re.fullmatch(r"(/v[\d.]+)?/info", path):
                return self._send(200, json.dumps({
                    "ID": "stand-in", "Name": "stand-in", "ServerVersion": "20.10.24", "OSType": "linux",
                    "Architecture": "x86_64", "NCPU": 2, "MemTotal": 1 << 30, "DefaultRuntime": "runc",
                    "Runtimes": runtimes}))
            return self._send(404, json.dumps({"message": "not served by the stand-in daemon"}))

        do_HEAD = do_POST = do_DELETE = do_GET

    return Handler


@pytest.fixture
def daemon(tmp_path):
    """start(runtimes) -> (DOCKER_HOST, the requests it got)."""
    servers = []

    def start(runtimes: dict):
        sock = str(tmp_path / "docker.sock")
        requests: list[str] = []
        server = _StandInDaemon(sock, _handler(runtimes, requests))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"unix://{sock}", requests

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


RUNC = {"runc": {"path": "runc"}, "io.containerd.runc.v2": {"path": "runc"}}
WITH_NVIDIA = {**RUNC, "nvidia": {"path": "nvidia-container-runtime"}}


def arrange(tmp_path, docker_host: str, compose: str = "real", gpus: int = 0) -> tuple[dict, str]:
    """The environment for a make call and the file logging each `docker`/`docker-compose` call.
    compose: "real" (forwarded to the real CLI), "stand-in" (`compose version` answered here, so the case
    does not depend on this machine's plugin), "missing" (as a CLI without the plugin answers)."""
    docker = real_docker()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    compose_case = {
        "real": "",
        "stand-in": 'if [ "$1 $2" = "compose version" ]; then echo "Docker Compose version v2.99.0 (stand-in)"; exit 0; fi\n'
                    'if [ "$1" = compose ]; then exit 1; fi\n',
        "missing": "if [ \"$1\" = compose ]; then echo \"docker: 'compose' is not a docker command.\" >&2; exit 1; fi\n",
    }[compose]
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "docker $*" >>"{log}"\n{compose_case}exec "{docker}" "$@"\n')
    # Compose v1 where a fallback would find it: make down/logs must not use it
    (bin_dir / "docker-compose").write_text(f'#!/bin/sh\necho "docker-compose $*" >>"{log}"\nexit 0\n')
    if gpus:
        lines = "".join(f"GPU {i}: NVIDIA GeForce RTX 2080 Ti (UUID: GPU-{i:08d}-0000-0000-0000-000000000000)\\n"
                        for i in range(gpus))
        (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nprintf "{lines}"\n')
    else:
        (bin_dir / "nvidia-smi").write_text(
            "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\nexit 9\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("DOCKER_CONTEXT", "GPU_CHECK", "MAKEFLAGS", "MAKELEVEL")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", DOCKER_HOST=docker_host,
               DOCKER_CONFIG=str(tmp_path / "docker-config"))
    return env, str(log)


def make(target: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", REPO, "--no-print-directory", target], env=env, capture_output=True,
                          text=True, timeout=120)


def calls(log: str) -> list[str]:
    return open(log).read().splitlines() if os.path.exists(log) else []


def assert_refused(r: subprocess.CompletedProcess, target: str, *phrases: str) -> str:
    """Exit 2 from make because the check exited 2, nothing on stdout (no recipe ran after it), and on stderr
    one sentence from the check plus make's own line; returns the sentence."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "", r.stdout
    lines = r.stderr.splitlines()
    assert len(lines) == 2, r.stderr
    sentence, make_line = lines
    assert MAKE_ERROR.match(make_line).groups() == (target, "2"), make_line
    assert sentence.startswith(f"make {target}: ") and sentence.endswith("."), sentence
    assert not re.search(r"\. [A-Z]", sentence), f"more than one sentence: {sentence}"
    for phrase in phrases:
        assert phrase in sentence, (phrase, sentence)
    assert "Traceback" not in r.stderr
    return sentence


def assert_nothing_built(log: str, requests: list[str] = ()) -> None:
    made = calls(log)
    assert not [c for c in made if re.match(r"docker (build|buildx|image|compose (up|down|logs|-f))|docker-compose", c)], made
    assert all(re.search(r"/(_ping|info)$", req) for req in requests), requests


def test_no_daemon_answers(tmp_path):
    env, log = arrange(tmp_path, "unix:///nonexistent")
    assert_refused(make("up", env), "up", "no Docker daemon answers at unix:///nonexistent",
                   "sudo systemctl start docker", "run make up again")
    assert calls(log) == ["docker info"]
    assert_nothing_built(log)


@pytest.mark.parametrize("target", ["up", "down", "logs"])
def test_no_compose_v2(tmp_path, daemon, target):
    host, requests = daemon(WITH_NVIDIA)
    env, log = arrange(tmp_path, host, compose="missing", gpus=2)
    assert_refused(make(target, env), target, "Docker Compose v2 is not installed",
                   "docker-compose-plugin", f"run make {target} again")
    assert calls(log) == ["docker info", "docker compose version"]
    assert_nothing_built(log, requests)


def test_no_gpu_names_the_cpu_override(tmp_path, daemon):
    host, requests = daemon(RUNC)
    env, log = arrange(tmp_path, host, compose="stand-in", gpus=0)
    assert_refused(make("up", env), "up", "no NVIDIA GPU is visible here (nvidia-smi -L lists none)",
                   "docker compose -f compose.yaml -f compose.cpu.yaml up -d")
    assert calls(log) == ["docker info", "docker compose version"]
    assert_nothing_built(log, requests)


def test_gpu_but_no_nvidia_runtime(tmp_path, daemon):
    host, requests = daemon(RUNC)
    env, log = arrange(tmp_path, host, compose="stand-in", gpus=2)
    assert_refused(make("up", env), "up", "Docker has no NVIDIA container runtime (docker info lists: "
                   "io.containerd.runc.v2 runc)", "nvidia-ctk runtime configure --runtime=docker",
                   "compose.cpu.yaml")
    assert calls(log)[:2] == ["docker info", "docker compose version"]
    assert_nothing_built(log, requests)


def test_no_docker_cli(tmp_path):
    """A PATH with every tool of /usr/bin and /usr/sbin but docker."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin"):
        if not os.path.isdir(d) or os.path.realpath(d) != d:   # /bin -> usr/bin on merged-/usr systems
            continue
        for name in os.listdir(d):
            if not name.startswith("docker") and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(os.path.join(d, name))
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL")}
    env["PATH"] = str(bin_dir)
    assert subprocess.run(["sh", "-c", "command -v docker"], env=env, capture_output=True).returncode != 0
    assert_refused(make("up", env), "up", "the docker CLI is not installed", "https://docs.docker.com/engine/install/")


def test_the_checks_pass_where_docker_can_serve_gpus(tmp_path, daemon):
    """The control: daemon, Compose v2, a GPU and the NVIDIA runtime -> the check says nothing and exits 0."""
    host, requests = daemon(WITH_NVIDIA)
    env, log = arrange(tmp_path, host, compose="stand-in", gpus=1)
    r = subprocess.run([UP_CHECK, "up"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert calls(log) == ["docker info", "docker compose version",
                          "docker info --format {{range $name, $_ := .Runtimes}}{{$name}} {{end}}"]
    assert_nothing_built(log, requests)


def test_gpu_check_0_skips_only_the_gpu_checks(tmp_path, daemon):
    host, _ = daemon(RUNC)
    env, _ = arrange(tmp_path, host, compose="stand-in", gpus=0)
    r = subprocess.run([UP_CHECK, "up"], env={**env, "GPU_CHECK": "0"}, capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stderr) == (0, "")
    env["DOCKER_HOST"] = "unix:///nonexistent"
    r = subprocess.run([UP_CHECK, "up"], env={**env, "GPU_CHECK": "0"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no Docker daemon answers" in r.stderr


def test_make_down_and_logs_use_compose_v2_only():
    """No docker-compose v1 fallback left in the Makefile (compose.cpu.yaml needs v2's !reset)."""
    r = subprocess.run(["make", "-C", REPO, "--no-print-directory", "-n", "down", "logs"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["tools/up-check.sh down", "docker compose down",
                                     "tools/up-check.sh logs", "docker compose logs -f"]
