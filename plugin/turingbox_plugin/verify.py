"""`verify`: the plugin's kernels vs references on one GPU, or `--compile-only --arch X.Y` without one."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from typing import Any

from turingbox_plugin import gdn
from turingbox_plugin.doctor import ptxas_path
from turingbox_plugin.errors import ToolError
from turingbox_plugin.kernels import COMPILE_SPECS, scaled_copy

_RESOURCE_RE = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "stack_bytes": re.compile(r"(\d+) bytes stack frame"),
}


# The architectures the appliance plans for (Turing, Ampere, Ada, Hopper, Blackwell datacenter and consumer);
# `verify --compile-only` refuses any other, since no plan would ever run its kernels there.
SUPPORTED_ARCHS = (75, 80, 86, 89, 90, 100, 120)


def arch_label(arch: int) -> str:
    """75 -> "7.5", 100 -> "10.0"."""
    return f"{arch // 10}.{arch % 10}"


def _supported_list() -> str:
    labels = [arch_label(a) for a in SUPPORTED_ARCHS]
    return ", ".join(labels[:-1]) + " and " + labels[-1]


def parse_arch(text: str) -> int:
    """"7.5" / "75" / "sm_75" / "sm_90a" -> 75 / 90 (any compute capability; see supported_arch)."""
    t = str(text).strip().lower().removeprefix("sm_").removeprefix("sm")
    t = t[:-1] if len(t) > 1 and t[-1] in "af" and t[-2].isdigit() else t   # sm_90a / sm_120f: the same chip
    m = re.fullmatch(r"(\d+)\.(\d)", t) or re.fullmatch(r"(\d)(\d)", t) or re.fullmatch(r"(\d\d)(\d)", t)
    if not m:
        raise ToolError(f"--arch {text!r} is invalid: use a compute capability such as 7.5 or 9.0 "
                        f"(supported: {_supported_list()}).")
    return int(m.group(1)) * 10 + int(m.group(2))


def supported_arch(text: str) -> int:
    """parse_arch, refusing an architecture outside SUPPORTED_ARCHS in one sentence (exit 2)."""
    arch = parse_arch(text)
    if arch not in SUPPORTED_ARCHS:
        raise ToolError(f"--arch {text} (sm_{arch}) is not supported: verify --compile-only compiles for "
                        f"{_supported_list()}.")
    return arch


def ptx_target(ptx: str, arch: int) -> str:
    """The `.target` the PTX names: Triton 3.6 writes sm_90a, sm_100a and sm_120a from Hopper on (its
    sm_arch_from_capability), and ptxas refuses to build sm_90a PTX for plain sm_90."""
    m = re.search(r"^\s*\.target\s+(sm_\d+[af]?)", ptx, re.M)
    return m.group(1) if m else f"sm_{arch}"


def ptxas_for(arch: int) -> str | None:
    """The ptxas Triton itself runs for `arch`: from sm_100 its ptxas-blackwell (CUDA 12.9), because the
    bundled ptxas (CUDA 12.8) reads PTX up to 8.7 and Triton writes 8.8 there. Honours Triton's
    TRITON_PTXAS_PATH / TRITON_PTXAS_BLACKWELL_PATH through its own knobs."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        path = get_ptxas(arch).path
        if path and os.path.exists(path):
            return path
    except Exception:  # noqa: BLE001 - an older or partial Triton: fall back to the doctor's lookup
        pass
    return ptxas_path()


def parse_ptxas_resources(log: str) -> dict[str, int]:
    out = {}
    for key, rx in _RESOURCE_RE.items():
        m = rx.search(log)
        out[key] = int(m.group(1)) if m else 0
    out["spills"] = out["spill_stores"] + out["spill_loads"]
    return out


def ptxas_resources(ptx: str, arch: int) -> dict[str, Any]:
    """Registers, spills and stack of one kernel's PTX, built by the ptxas Triton uses for `arch` and for
    the target the PTX names (sm_90a on Hopper); "target" says which."""
    path = ptxas_for(arch)
    if not path:
        raise RuntimeError("no ptxas (set TRITON_PTXAS_PATH)")
    target = ptx_target(ptx, arch)
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([path, f"-arch={target}", "-v", src, "-o", os.path.join(d, "k.cubin")],
                           capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError((r.stderr or r.stdout).strip().splitlines()[-1] if (r.stderr or r.stdout) else "ptxas failed")
    return {**parse_ptxas_resources(r.stdout + r.stderr), "target": target}


def compile_one(name: str, fn: Any, signature: dict, constexprs: dict, arch: int,
                num_warps: int | None = None) -> dict[str, Any]:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    row: dict[str, Any] = {"name": name, "arch": arch_label(arch), "ok": False}
    try:
        options = {"num_warps": num_warps} if num_warps else {}
        k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                           target=GPUTarget("cuda", arch, 32), options=options)
        row["shared_bytes"] = int(k.metadata.shared)
        row["num_warps"] = int(k.metadata.num_warps)
        res = ptxas_resources(k.asm["ptx"], arch)
        row.update(registers=res["registers"], spills=res["spills"], stack_bytes=res["stack_bytes"],
                   target=res["target"])
        limit = shared_limit(arch)
        row["shared_limit_bytes"] = limit
        row["ok"] = row["shared_bytes"] <= limit
        if not row["ok"]:
            row["error"] = f"needs {row['shared_bytes']} bytes of shared memory, sm_{arch} allows {limit}"
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1] if str(exc).strip() else ''}"
    return row


def shared_limit(arch: int) -> int:
    """Opt-in shared memory per block (bytes) of a compute capability."""
    return 65536 if arch < 80 else (101376 if arch in (86, 89, 120, 121) else 166912 if arch in (80, 87) else 232448)


def compile_report(arch_text: str) -> list[dict[str, Any]]:
    """One table for an arch: the plugin's Triton kernels, the turbo GDN kernels, then the rows of every
    COMPILE_REPORTS_GROUP entry point (the appliance's AOT Triton specializations and FlashInfer modules)."""
    arch = supported_arch(arch_text)
    rows = [compile_one(name, fn, sig, cx, arch) for name, (fn, sig, cx) in COMPILE_SPECS.items()]
    try:
        rows.extend(gdn.compile_report(arch_label(arch)))
    except Exception as exc:
        rows.append({"name": "turingbox_plugin.gdn", "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    for name, fn in extra_compile_reports():
        try:
            rows.extend(fn(arch))
        except Exception as exc:  # one broken extension is its own failing row
            rows.append({"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"})
    return rows


# Rows that need more than the plugin (kernels the appliance bakes into the image: its AOT Triton
# specializations, FlashInfer's modules) come in through this entry-point group: each entry is a function
# (arch: int, e.g. 75) -> list of rows like compile_one's, so the plugin imports nothing of the appliance.
COMPILE_REPORTS_GROUP = "turingbox_plugin.compile_reports"


def extra_compile_reports() -> list[tuple[str, Any]]:
    from importlib.metadata import entry_points
    out = []
    for ep in sorted(entry_points(group=COMPILE_REPORTS_GROUP), key=lambda e: e.name):
        try:
            out.append((ep.name, ep.load()))
        except Exception as exc:  # noqa: BLE001 - reported as a row, not raised
            out.append((ep.name, lambda _arch, exc=exc, name=ep.name: [
                {"name": name, "ok": False, "error": f"not loadable ({type(exc).__name__}: {exc})"}]))
    return out


def run_on_gpu() -> list[dict[str, Any]]:
    """Each plugin kernel on synthetic tensors against a torch reference (one GPU)."""
    import torch

    if not torch.cuda.is_available():
        raise ToolError("verify needs a CUDA GPU; use --compile-only --arch 7.5 without one.")
    rows = []
    for dtype in (torch.float16, torch.float32):
        x = torch.randn(10_007, device="cuda", dtype=dtype)
        got = scaled_copy(x, 0.5)
        ref = x * 0.5
        err = (got.float() - ref.float()).abs().max().item()
        rows.append({"name": f"scaled_copy_kernel[{str(dtype).split('.')[-1]}]", "ok": err <= 1e-3,
                     "max_abs_err": err})
    if hasattr(gdn, "verify_report"):    # the GDN library's GPU check, when it has one (docs/benchmarks.md)
        rows.extend(gdn.verify_report())
    return rows
