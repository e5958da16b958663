"""FlashInfer modules built ahead of time (turingbox_warmup.image.flashinfer_aot builds them at image build): each module
directory of the baked layout `<base>/.cache/flashinfer/<version>/<archs>/cached_ops/<uri>/` holds `<uri>.so`, a
prebuilt build.ninja and the MARKER file. A new cache entry's flashinfer/ (FLASHINFER_WORKSPACE_BASE) starts with
a copy of them (store.prepare_cache, setting aot_flashinfer_dir), as it starts with the AOT Triton kernels."""
from __future__ import annotations

import json
import os
import shutil
from typing import Any

MARKER = "turingbox-prebuilt.json"


def prebuilt_modules(base: str) -> list[dict[str, Any]]:
    """Every module under a baked base: its marker plus `path` (the module directory)."""
    out = []
    root = os.path.join(base, ".cache", "flashinfer")
    for dirpath, _dirs, files in os.walk(root):
        if MARKER in files:
            with open(os.path.join(dirpath, MARKER), encoding="utf-8") as f:
                out.append({**json.load(f), "path": dirpath})
    return sorted(out, key=lambda m: (m.get("workspace_arch", ""), m.get("uri", "")))


def seed_workspace(aot_base: str, workspace_base: str) -> int:
    """Copy the baked modules a workspace (an entry's flashinfer/ folder) lacks; returns how many were copied.

    Module directories are named by FlashInfer version, arch and URI (the URI spells every template argument),
    so one of the same name is the same module: an existing one is never replaced."""
    copied = 0
    src_root = os.path.join(aot_base, ".cache", "flashinfer")
    if not os.path.isdir(src_root):
        return 0
    for mod in prebuilt_modules(aot_base):
        rel = os.path.relpath(mod["path"], aot_base)
        dst = os.path.join(workspace_base, rel)
        if os.path.exists(os.path.join(dst, f"{mod['uri']}.so")):
            continue
        tmp = f"{dst}.tmp-{os.getpid()}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copytree(mod["path"], tmp)
            for dirpath, dirs, files in os.walk(tmp):           # the image layer is read-only (0444/0555)
                for name in dirs + files:
                    p = os.path.join(dirpath, name)
                    os.chmod(p, os.stat(p).st_mode | 0o200)
            os.chmod(tmp, os.stat(tmp).st_mode | 0o200)
            if os.path.isdir(dst):          # e.g. FlashInfer's tmp/lock dir or a half-built JIT dir: ours wins
                shutil.rmtree(dst)
            os.replace(tmp, dst)
            copied += 1
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return copied
