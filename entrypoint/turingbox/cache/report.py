"""`turingbox cache show|verify` (parser: cli/cache.py): the entries of a cache root, listed or checked file by file,
from the typed cache settings."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from turingbox.cache import store
from turingbox.config import CacheSettings
from turingbox.errors import UsageError


def describe_entries(root: str, verify: bool = False) -> list[dict[str, Any]]:
    rows = []
    for key, manifest in store.list_entries(root).items():
        m = manifest or {}
        sizes = m.get("sizes") or {}
        completed = bool(m.get("completed")) and not store.manifest_problem(m, key)
        # completed by a start that never reached a real engine (a stand-in): nothing a start could hit
        empty = completed and not store.has_engine_artefacts(store.entry_dir(root, key), m)
        row = {
            "key": key, "complete": completed and not empty, "empty": empty,
            "created": m.get("created"), "completed": m.get("completed"), "hits": m.get("hits", 0),
            "source": m.get("source"), "sizes": sizes,
            "bytes": sum(int(s.get("bytes", 0)) for s in sizes.values() if isinstance(s, Mapping)),
            "manifest_ok": manifest is not None and store.manifest_problem(m, key) is None,
            "inputs": m.get("inputs"),
        }
        if verify:
            row["problems"] = store.entry_problems(store.entry_dir(root, key), key, deep=True)
            row["verified"] = not row["problems"]
        rows.append(row)
    return rows


def _print_rows(rows: list[dict[str, Any]]) -> None:
    if rows:
        print(f"{'KEY':<18}{'COMPLETE':<10}{'CREATED':<22}{'HITS':>6}{'SIZE MiB':>10}  CACHES")
    for r in rows:
        state = "yes" if r["complete"] else ("corrupt" if not r["manifest_ok"] else "empty" if r.get("empty") else "no")
        if r.get("verified") is False and state == "yes":
            state = "corrupt"
        per = " ".join(f"{k}={v.get('bytes', 0) / 2**20:.1f}" for k, v in r["sizes"].items())
        print(f"{r['key']:<18}{state:<10}{str(r['created'] or '-'):<22}{r['hits'] or 0:>6}"
              f"{r['bytes'] / 2**20:>10.1f}  {per}")


def show(cache: CacheSettings, as_json: bool) -> int:
    """`cache show`: the entries of the volume, and those baked into the image (verified)."""
    root = os.path.abspath(cache.cache_dir)
    baked = cache.baked_cache_dir
    if not os.path.isdir(root) and not (baked and os.path.isdir(baked)):
        raise UsageError(f"The cache root {root} (cache_dir / TURINGBOX_CACHE_DIR) does not exist.")
    rows = describe_entries(root) if os.path.isdir(root) else []
    # Entries baked into the image (read-only layer): verified here, since nothing else checks them
    # before a start copies one into the volume.
    baked_rows = describe_entries(baked, verify=True) if baked and os.path.isdir(baked) else None
    if as_json:
        print(json.dumps({"root": root, "entries": rows,
                          "baked": None if baked_rows is None else {"root": baked, "entries": baked_rows}},
                         indent=2))
        return 0
    print(f"cache root {root}: {len(rows)} entr{'y' if len(rows) == 1 else 'ies'}")
    _print_rows(rows)
    if baked_rows is not None:
        print(f"baked into the image at {baked} (read-only): {len(baked_rows)} entr{'y' if len(baked_rows) == 1 else 'ies'}")
        _print_rows(baked_rows)
    return 0


def verify(cache: CacheSettings, keys: Sequence[str], baked: bool, as_json: bool) -> int:
    """`cache verify`: check manifests and files of the named entries (all by default); 1 if one is corrupt."""
    if baked:
        if not cache.baked_cache_dir:
            raise UsageError("--baked needs the setting baked_cache_dir (TURINGBOX_BAKED_CACHE_DIR).")
        root = os.path.abspath(cache.baked_cache_dir)
    else:
        root = os.path.abspath(cache.cache_dir)
    if not os.path.isdir(root):
        raise UsageError(f"The cache root {root} (cache_dir / TURINGBOX_CACHE_DIR) does not exist.")
    entries = store.list_entries(root)
    keys = list(keys) or sorted(entries)
    unknown = [k for k in keys if k not in entries]
    if unknown:
        raise UsageError(f"No cache entry {unknown[0]} under {root} ({len(entries)} entries exist).")
    report, corrupt = {}, 0
    for key in keys:
        problems = store.entry_problems(store.entry_dir(root, key), key, deep=True)
        # an interrupted seed, or an entry no real engine wrote to: misses, not corruption
        incomplete = problems in ([store.INCOMPLETE], [store.NO_ARTEFACTS])
        report[key] = {"ok": not problems, "incomplete": incomplete, "problems": problems}
        corrupt += bool(problems) and not incomplete
    if as_json:
        print(json.dumps({"root": root, "entries": report, "corrupt": corrupt}, indent=2))
    else:
        for key, r in report.items():
            verdict = "ok" if r["ok"] else ("incomplete" if r["incomplete"] else "CORRUPT")
            print(f"{key}: {verdict}" + "".join(f"\n  - {p}" for p in r["problems"]))
        print(f"{len(keys)} checked, {corrupt} corrupt")
    # An incomplete entry is a normal miss (an interrupted seed), not corruption.
    return 1 if corrupt else 0
