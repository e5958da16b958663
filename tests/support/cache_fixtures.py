"""Fixtures of the tests of the cache and of its users (the warmup tools, `turingbox cache`, the startup bench):
each folder's conftest (or the module) imports them; helpers live in cache_helpers."""
from __future__ import annotations

import tempfile

import pytest

from tests.support.cache_helpers import make_plan


@pytest.fixture
def plan():
    return make_plan()


@pytest.fixture(autouse=True)
def private_tmpdir(tmp_path, monkeypatch):
    """TMPDIR inside tmp_path, for this process's tempfile and for every subprocess: private/cold
    cache copies land there, so a test that leaks one leaks it into its own tmp_path, not /tmp."""
    d = tmp_path / "tmpdir"
    d.mkdir()
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return str(d)
