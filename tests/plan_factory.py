"""Real plans for tests that need a `turingbox.plan.types.Plan`: the planner's own output for a GPU fixture
(the built-in demo model, planned in memory), with chosen fields replaced (`from tests.plan_factory import planned`)."""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gpus"


@functools.lru_cache(maxsize=None)
def _planned(fixture: str):
    from turingbox.plan.command import plan_from_args
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    env["TURINGBOX_GPUS_JSON"] = str(FIXTURES / f"{fixture}.json")
    return plan_from_args(None, env=env, write_demo=False)


def planned(fixture: str = "1xh200", **changes):
    """The plan for tests/fixtures/gpus/<fixture>.json, with `changes` replaced (dataclasses.replace)."""
    return dataclasses.replace(_planned(fixture), **changes)
