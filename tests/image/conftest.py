"""Fixtures of the image tests: volumes and containers removed afterwards (the image itself, `image`, and the
docker helpers live in tests/support/docker_image.py, shared with the reliability tests)."""
from __future__ import annotations

import pytest

from tests.support.docker_image import docker, unique


@pytest.fixture
def volume(docker_engine):
    """A fresh named volume, removed afterwards."""
    names = []

    def make() -> str:
        name = unique("turingbox-test-vol")
        docker("volume", "create", name)
        names.append(name)
        return name

    yield make
    for name in names:
        docker("volume", "rm", "-f", name, check=False)


@pytest.fixture
def container(docker_engine):
    """Start detached containers (`docker run -d ...`); each is removed afterwards."""
    names = []

    def run(*args: str) -> str:
        name = unique("turingbox-test")
        names.append(name)
        docker("run", "-d", "--name", name, *args)
        return name

    yield run
    for name in names:
        docker("rm", "-f", "-v", name, check=False)
