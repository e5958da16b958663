"""Two appliance containers on one cache volume at once (real Docker engine, the real image).

Each container runs the image's own `turingbox serve` (planner, cache session, sidecar) with the
stand-in upstream bind-mounted in place of vLLM (tests/support/engine_filling_caches.py, which writes
compile artefacts into the entry, then becomes tests/support/fake_vllm.py), so both start, take their
cache decisions on the same volume at the same moment and become ready. Afterwards `turingbox cache verify` in a third
container must find the entry complete and sound, and a third serve must hit it.

Image: the session's appliance image (tests/support/docker_image.py: $TURINGBOX_TEST_IMAGE, else the real Dockerfile
built once per run, the one tests/image checks).
"""
from __future__ import annotations

import os
import subprocess
import uuid

import httpx
import pytest

from tests.support.sidecar_harness import FAKE_VLLM, H200, free_port, make_model_dir
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.docker, pytest.mark.timeout(400)]


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def container_log(name: str) -> str:
    r = docker("logs", name, check=False)
    return r.stdout + r.stderr


def test_two_containers_share_one_cache_volume_without_corruption(image, tmp_path):
    tag = uuid.uuid4().hex[:8]
    volume = f"turingbox-rel-cache-{tag}"
    model = make_model_dir(str(tmp_path))
    os.chmod(tmp_path, 0o755)
    names: list[str] = []
    docker("volume", "create", volume)
    common = ["-v", f"{volume}:/cache", "-v", f"{model}:/model:ro",
              # the repo's tests/: engine_filling_caches.py writes compile artefacts into the entry (completed only
              # then) and becomes tests/support/fake_vllm.py
              "-v", f"{os.path.dirname(os.path.dirname(FAKE_VLLM))}:/tests:ro",
              "-v", f"{os.path.dirname(H200)}:/fixtures:ro",
              "-e", "TURINGBOX_VLLM_COMMAND=python3 /tests/support/engine_filling_caches.py",
              "-e", "TURINGBOX_ACTIVE_WARMUP=0",
              "-e", "FAKE_VLLM_STAGE_SECONDS=1", "--read-only", "--tmpfs", "/tmp"]
    serve_args = ["serve", "--gpus-json", "/fixtures/h200.json", "--model", "/model"]
    try:
        ports = []
        for i in range(2):            # started back to back: both reach the cache at the same moment
            port = free_port()
            name = f"turingbox-rel-{tag}-{i}"
            docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", *common, image, *serve_args)
            names.append(name)
            ports.append(port)

        def ready(port: int) -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        for name, port in zip(names, ports):
            try:
                wait_until(lambda: ready(port), 180, interval=0.5, what=f"{name} ready")
            except AssertionError:
                raise AssertionError(docker("logs", name, check=False).stderr[-4000:]) from None
        keys = {httpx.get(f"http://127.0.0.1:{p}/turingbox/plan", timeout=5).json()["cache_key"] for p in ports}
        assert len(keys) == 1
        for p in ports:               # both serve
            r = httpx.post(f"http://127.0.0.1:{p}/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == "tok0 tok1 "
        # the writer completes its entry right after ready, off the event loop: wait for its verdict line
        wait_until(lambda: any(" complete: " in container_log(n) for n in names), 60, interval=0.5,
                   what="the cache entry's completion in a container's log")
        for name in names:
            docker("stop", "-t", "30", name, timeout=90)
            assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        logs = "".join(docker("logs", n).stdout + docker("logs", n).stderr for n in names)
        assert "Traceback" not in logs

        verify = docker("run", "--rm", "-v", f"{volume}:/cache", image, "cache", "verify", check=False)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        third = f"turingbox-rel-{tag}-2"
        port = free_port()
        docker("run", "-d", "--name", third, "-p", f"127.0.0.1:{port}:8000", *common, image, *serve_args)
        names.append(third)
        wait_until(lambda: ready(port), 180, interval=0.5, what="third container ready")
        out = docker("logs", third).stdout + docker("logs", third).stderr
        assert '"result":"hit"' in out.replace(" ", ""), out[-3000:]
    finally:
        for name in names:
            docker("rm", "-f", "-v", name, check=False)
        docker("volume", "rm", "-f", volume, check=False)
