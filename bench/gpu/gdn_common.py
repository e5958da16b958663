"""Helpers shared by the GDN GPU scripts (run on the GPU machine from the repository root)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugin"
LIB = Path(os.environ.get("TBPLUGIN_GDN_LIB") or PLUGIN / "turingbox_plugin" / "lib" / "libturingbox_gdn.so")
if str(PLUGIN) not in sys.path:
    sys.path.insert(0, str(PLUGIN))

# Qwen3.6-27B GDN heads at TP=1/2/4: (key heads, value heads) per rank, head dim 128.
HEAD_SPLITS = {1: (16, 48), 2: (8, 24), 4: (4, 12)}


def out_dir() -> Path:
    d = Path(os.environ.get("OUT") or (REPO / "out"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def ensure_library(force: bool = False) -> dict:
    """Build plugin/turingbox_plugin/lib/libturingbox_gdn.so here unless a fresh one exists."""
    srcs = sorted((PLUGIN / "turingbox_plugin" / "csrc").glob("*"))
    # Content, not mtime: each device call re-sends the checkout, which makes every source look new.
    # Same digest and stamp file as bootstrap.sh's (`cat csrc/* | sha256sum`), so its build counts as fresh.
    import hashlib
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in srcs)).hexdigest()
    stamp = LIB.with_suffix(".sha256")
    fresh = LIB.is_file() and stamp.is_file() and stamp.read_text().strip() == digest
    if fresh and not force:
        return {"built": False, "path": str(LIB)}
    t0 = time.time()
    env = dict(os.environ)
    env.setdefault("ARCHS", "75 80 86 89 90")
    env["GDN_LIB_OUT"] = str(LIB)
    proc = subprocess.run(["bash", str(PLUGIN / "build_gdn.sh")], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError("build_gdn.sh failed:\n" + proc.stdout[-2000:] + proc.stderr[-4000:])
    stamp.write_text(digest)
    return {"built": True, "path": str(LIB), "seconds": round(time.time() - t0, 1),
            "archs": env["ARCHS"]}


def vllm_kernels():
    """vLLM 0.21's FLA kernels, or (None, reason)."""
    try:
        from vllm.model_executor.layers.fla.ops import (
            chunk_gated_delta_rule,
            fused_sigmoid_gating_delta_rule_update,
        )
    except Exception as exc:  # noqa: BLE001 - report any import problem
        return None, f"{type(exc).__name__}: {exc}"
    return (chunk_gated_delta_rule, fused_sigmoid_gating_delta_rule_update), None
