"""The seed's progress protocol: the lines `turingbox warmup` prints on stdout while it fills a cache entry, which
`make warmup-cache` (turingbox_warmup.seed_volume) reads back from the container's log to drive its progress bar.

    turingbox-stage: <name> [detail]       one per stage reached, names from STAGES
    turingbox-seed-result: {json}          once, at the end: the entry's key, mode, result and sizes

Both sides import this module, so the writer and the parser cannot drift apart."""
from __future__ import annotations

import json
from typing import Any, Mapping

STAGE_PREFIX = "turingbox-stage: "
RESULT_PREFIX = "turingbox-seed-result: "
# In order. A stage may be skipped ("download": hub ids only), and a seed whose engine compiled its graphs starts the
# engine once more ("loading-start", then the engine stages again: turingbox_warmup/seed.py, _warm_engine_async).
STAGES = ("plan", "download", "cache", "engine-start", "engine-ready", "strict-warmup", "active-warmup", "engine-stop",
          "loading-start", "complete")


def stage_line(name: str, detail: str = "") -> str:
    assert name in STAGES, name
    return f"{STAGE_PREFIX}{name}" + (f" {detail}" if detail else "")


def result_line(result: Mapping[str, Any]) -> str:
    return RESULT_PREFIX + json.dumps(dict(result), sort_keys=True)


def stage_of(line: str) -> str | None:
    """The stage a log line announces, or None (another line, or a name this protocol does not know)."""
    if not line.startswith(STAGE_PREFIX):
        return None
    name = line[len(STAGE_PREFIX):].split(" ", 1)[0]
    return name if name in STAGES else None


def is_result(line: str) -> bool:
    return line.startswith(RESULT_PREFIX)


def result_of(line: str) -> dict[str, Any] | None:
    """The result object of a result line, or None (another line, or one whose JSON is cut or broken)."""
    if not is_result(line):
        return None
    try:
        return json.loads(line[len(RESULT_PREFIX):])
    except ValueError:
        return None
