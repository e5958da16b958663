"""The appliance image under test: the real Dockerfile built once per session on a local base, for every test
that needs it (tests/image, and the reliability tests' two containers on one cache volume). A plugin of
tests/conftest.py, so one pytest run builds it once whichever folder asks first.

The base is TURINGBOX_TEST_BASE_IMAGE (default: the Debian stand-in that tools/ci/build-base.sh
makes, built here when missing). TURINGBOX_TEST_IMAGE names an already-built image to test instead
of building one. Build time and image size are printed at the end of the session.
"""
from __future__ import annotations

import base64
import glob
import json
import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE_IMAGE = os.environ.get("TURINGBOX_TEST_BASE_IMAGE", "turingbox-base:bookworm")
TEST_TAG = "turingbox:image-test"
BUILD_LOG = os.path.join(REPO, "build", "image-test", "docker-build.log")
# The machine's own extra CAs (a TLS-intercepting proxy's, here): passed the way a user behind such a
# proxy would, through EXTRA_CA_CERT_B64.
LOCAL_CA_GLOB = "/usr/local/share/ca-certificates/*.crt"

_report: dict[str, str] = {}


def docker(*args: str, check: bool = True, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args[:3])} ... exited {result.returncode}:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pytest_terminal_summary(terminalreporter):
    if _report:
        terminalreporter.section("turingbox image")
        for key, value in _report.items():
            terminalreporter.write_line(f"{key}: {value}")


@pytest.fixture(scope="session")
def docker_engine() -> None:
    if shutil.which("docker") is None:
        pytest.fail("the docker client is not installed (tools/ci/install-docker-tools.sh)")
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker engine answers (tools/ci/start-dockerd.sh starts one)")


@pytest.fixture(scope="session")
def image(docker_engine) -> str:
    """The appliance image under test (built once per session)."""
    prebuilt = os.environ.get("TURINGBOX_TEST_IMAGE")
    if prebuilt:
        docker("image", "inspect", prebuilt)
        _report["image"] = f"{prebuilt} (prebuilt)"
        _report["image size"] = image_size(prebuilt)
        return prebuilt
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode != 0:
        if BASE_IMAGE != "turingbox-base:bookworm":
            pytest.fail(f"base image {BASE_IMAGE} is not present")
        subprocess.run([os.path.join(REPO, "tools/ci/build-base.sh"), BASE_IMAGE], check=True, timeout=1800)
    args = ["-t", TEST_TAG, "--build-arg", f"BASE_IMAGE={BASE_IMAGE}"]
    extra_ca = b"".join(open(p, "rb").read() for p in sorted(glob.glob(LOCAL_CA_GLOB)))
    if extra_ca:
        args += ["--build-arg", "EXTRA_CA_CERT_B64=" + base64.b64encode(extra_ca).decode()]
    os.makedirs(os.path.dirname(BUILD_LOG), exist_ok=True)
    started = time.monotonic()
    with open(BUILD_LOG, "w") as log:
        build = subprocess.run([os.path.join(REPO, "tools/ci/docker-build.sh"), *args, REPO],
                               stdout=log, stderr=subprocess.STDOUT, timeout=3600)
    elapsed = time.monotonic() - started
    if build.returncode != 0:
        with open(BUILD_LOG) as log:
            tail = log.read()[-6000:]
        pytest.fail(f"image build failed (exit {build.returncode}, full log in {BUILD_LOG}):\n{tail}")
    _report["image"] = f"{TEST_TAG} on {BASE_IMAGE}"
    _report["build time"] = f"{elapsed:.0f} s (log: {BUILD_LOG})"
    _report["image size"] = image_size(TEST_TAG)
    return TEST_TAG


def image_size(tag: str) -> str:
    size = int(docker("image", "inspect", "-f", "{{.Size}}", tag).stdout.strip())
    return f"{size / 1e9:.2f} GB ({size} bytes)"


@pytest.fixture(scope="session")
def image_config(image) -> dict:
    return json.loads(docker("image", "inspect", image).stdout)[0]
