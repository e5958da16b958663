"""Fixtures of the serve/sidecar tests (helpers live in sidecar_harness)."""
import pytest

from tests.support.sidecar_harness import Serve


@pytest.fixture
def serve_factory(tmp_path):
    started: list[Serve] = []

    def make(**kw) -> Serve:
        d = tmp_path / f"s{len(started)}"
        d.mkdir()
        s = Serve(str(d), **kw)
        started.append(s)
        return s
    yield make
    for s in started:
        s.close()
