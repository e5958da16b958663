"""Real plans for tests that need a `turingbox.plan.types.Plan`: the planner's own output for a GPU fixture
(the built-in demo model, planned in memory), with chosen fields replaced (`from tests.support.plan_factory import planned`)."""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpus"


@functools.lru_cache(maxsize=None)
def _planned(fixture: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    env["TURINGBOX_GPUS_JSON"] = str(FIXTURES / f"{fixture}.json")
    return plan_from_env(env, write_demo=False)


def planned(fixture: str = "1xh200", **changes):
    """The plan for tests/fixtures/gpus/<fixture>.json, with `changes` replaced (dataclasses.replace)."""
    return dataclasses.replace(_planned(fixture), **changes)


def cache_settings(root, environ=None, **changes):
    """The cache settings prepare_cache takes: cache_dir `root`, the others from `environ` (none: the defaults),
    then `changes` (e.g. baked_cache_dir, cache_lock_wait)."""
    from turingbox import config
    return dataclasses.replace(config.load_group("cache", None, environ or {}), cache_dir=str(root), **changes)


def plan_from_env(env, write_demo=True):
    """What `turingbox plan` (write_demo False) or serve/warmup (True) plan from these variables alone."""
    from turingbox import config
    from turingbox.plan.from_settings import plan_from_settings
    loaded = config.load(None, env, groups=("plan", "demo"))
    return plan_from_settings(loaded.plan, loaded.demo, write_demo=write_demo, environ=env)


def plan_settings(settings=None, **values):
    """PlanSettings as `turingbox plan` loads them: each value (None: left unset) through its TURINGBOX_* variable,
    so a value the table refuses raises its UsageError here, as at the edge."""
    from turingbox import config
    given = {**(settings or {}), **values}
    env = {config.REGISTRY[k].env_name: str(v) for k, v in given.items() if v is not None}
    return config.load_group("plan", None, env)
