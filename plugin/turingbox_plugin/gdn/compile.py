"""Compile evidence without a GPU: build every GDN kernel for one architecture with nvcc and
report per kernel the registers, spills and shared memory (ptxas --resource-usage) and the
number of tensor-core instructions (HMMA) in its SASS (cuobjdump -sass)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from turingbox_plugin import contract

_PKG = Path(__file__).resolve().parent.parent
# CUDA sources ship inside the package (turingbox_plugin/csrc) so installed copies can report too.
CSRC = _PKG / "csrc"
SOURCES = ("gdn_prefill.cu", "gdn_decode.cu")
# Kernel -> (path, threads per block) for occupancy notes; names as in plugin/csrc.
KERNELS = {
    "gdn_chunk_prep_kernel": ("prefill", 256),
    "gdn_chunk_state_kernel": ("prefill", 128),
    "gdn_decode_kernel": ("decode", 128),
}
_TYPES = {"__half": "fp16", "__nv_bfloat16": "bf16"}
SHARED_PER_SM = {"75": 65536, "80": 167936, "86": 102400, "89": 102400, "90": 233472}

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")
_SASS_FN = re.compile(r"Function : (\S+)")


def normalize_arch(arch: str) -> str:
    """'7.5', '75', 'sm_75' -> '75'."""
    a = str(arch).strip().lower().removeprefix("sm_").removeprefix("compute_")
    a = a.replace(".", "")
    if not re.fullmatch(r"\d{2,3}", a):
        raise ValueError(f"arch must look like 7.5, 75 or sm_75, not {arch!r}.")
    return a


def find_tool(name: str, nvcc: str | None = None) -> str | None:
    """A CUDA binary from PATH, CUDA_HOME, next to nvcc, or the one Triton bundles."""
    found = shutil.which(name)
    if found:
        return found
    # CUDA_HOME: the CUDA toolkit's variable
    dirs = [contract.variable("CUDA_HOME") or "", "/usr/local/cuda"]
    candidates = [Path(d) / "bin" / name for d in dirs if d]
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent / name)
    spec = importlib.util.find_spec("triton")
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.append(Path(loc) / "backends" / "nvidia" / "bin" / name)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def short_name(mangled: str) -> tuple[str, str]:
    """_ZN5tbgdn22gdn_chunk_state_kernelI6__halfEEvNS_9StateArgsE -> (gdn_chunk_state_kernel, fp16)."""
    m = re.match(r"_ZN5tbgdn(\d+)", mangled)
    if not m:
        return mangled, ""
    n = int(m.group(1))
    name = mangled[m.end() : m.end() + n]
    rest = mangled[m.end() + n :]
    t = re.match(r"I(\d+)", rest)
    dtype = ""
    if t:
        tn = rest[t.end() : t.end() + int(t.group(1))]
        dtype = _TYPES.get(tn, tn)
    return name, dtype


def parse_ptxas(text: str) -> dict[str, dict]:
    """Per mangled entry: registers, spill stores/loads, stack, shared bytes."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = out.setdefault(m.group(1), {"arch": m.group(2)})
            continue
        if current is None:
            continue
        m = _SPILL.search(line)
        if m:
            current.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                           spill_loads=int(m.group(3)))
            continue
        m = _USED.search(line)
        if m:
            current.update(registers=int(m.group(1)), shared_bytes=int(m.group(2) or 0))
    return out


def count_sass(text: str, opcode: str = "HMMA") -> dict[str, int]:
    counts: dict[str, int] = {}
    fn = None
    for line in text.splitlines():
        m = _SASS_FN.search(line)
        if m:
            fn = m.group(1)
            counts.setdefault(fn, 0)
        elif fn and re.search(rf"\b{opcode}\b|\b{opcode}\.", line):
            counts[fn] += 1
    return counts


def compile_report(arch: str, nvcc: str | None = None, sources_dir: str | os.PathLike | None = None,
                   timeout: float = 300.0) -> list[dict]:
    """Compile the GDN kernels for `arch` and return one dict per kernel instantiation:
    name, dtype, path (prefill|decode), arch, ok, registers, spills, spill_stores, spill_loads,
    stack_bytes, shared_bytes, blocks_per_sm_by_smem, hmma (None when no cuobjdump), error."""
    sm = normalize_arch(arch)
    label = f"{sm[:-1]}.{sm[-1]}"   # "75" -> "7.5", the form `verify` uses for Triton kernels
    nvcc = nvcc or find_tool("nvcc")
    src_dir = Path(sources_dir) if sources_dir else CSRC
    if not nvcc:
        return [{"name": s, "arch": label, "ok": False, "error": "nvcc not found"} for s in SOURCES]
    cuobjdump = find_tool("cuobjdump", nvcc)
    report: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tb-gdn-") as tmp:
        for src in SOURCES:
            obj = Path(tmp) / (src + ".o")
            cmd = [nvcc, "-O3", "-std=c++17", f"-arch=sm_{sm}", "--resource-usage", "-c",
                   str(src_dir / src), "-o", str(obj)]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                report.append({"name": src, "arch": label, "ok": False, "error": str(exc)})
                continue
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
                report.append({"name": src, "arch": label, "ok": False, "error": " | ".join(tail)})
                continue
            entries = parse_ptxas(proc.stdout + proc.stderr)
            hmma: dict[str, int] | None = None
            if cuobjdump:
                sass = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True,
                                      timeout=timeout)
                if sass.returncode == 0:
                    hmma = count_sass(sass.stdout)
            for mangled, info in sorted(entries.items()):
                name, dtype = short_name(mangled)
                path, threads = KERNELS.get(name, ("other", 0))
                smem = info.get("shared_bytes", 0)
                cap = SHARED_PER_SM.get(sm)
                report.append({
                    "name": name, "dtype": dtype, "mangled": mangled, "source": src, "path": path,
                    "arch": label, "ok": True,
                    "registers": info.get("registers"),
                    "spills": info.get("spill_stores", 0) + info.get("spill_loads", 0),
                    "spill_stores": info.get("spill_stores", 0),
                    "spill_loads": info.get("spill_loads", 0),
                    "stack_bytes": info.get("stack_bytes", 0),
                    "shared_bytes": smem, "threads": threads,
                    "blocks_per_sm_by_smem": (cap // smem if smem else None) if cap else None,
                    "hmma": None if hmma is None else hmma.get(mangled, 0),
                    "error": None,
                })
    return report
