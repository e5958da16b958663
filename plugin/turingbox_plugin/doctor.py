"""`doctor [MODEL]`: one PASS/WARN/FAIL line per prerequisite; never initialises CUDA, never a traceback."""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Callable

from turingbox_plugin import contract
from turingbox_plugin.errors import ToolError
from turingbox_plugin.model_config import load_model_config

REQUIRED_VLLM = "0.21.0"
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

# GDN entry points the turbo path replaces: (file under the vllm package, symbol defined there).
GDN_INTERFACE = (
    ("model_executor/layers/fla/ops/chunk.py", "def chunk_gated_delta_rule"),
    ("model_executor/layers/fla/ops/fused_recurrent.py", "def fused_recurrent_gated_delta_rule_packed_decode"),
    ("model_executor/layers/fla/ops/fused_sigmoid_gating.py", "def fused_sigmoid_gating_delta_rule_update"),
    ("model_executor/layers/mamba/gdn_linear_attn.py", "class GatedDeltaNetAttention"),
)


@dataclass
class Check:
    name: str
    status: str
    detail: str


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_python() -> Check:
    ok = sys.version_info >= (3, 10)
    return Check("python", PASS if ok else FAIL, f"{platform.python_version()} ({sys.executable})")


def check_torch() -> Check:
    v = _version("torch")
    if not v:
        return Check("torch", FAIL, "torch is not installed")
    return Check("torch", PASS, v)


def check_cuda_runtime() -> Check:
    if importlib.util.find_spec("torch") is None:
        return Check("cuda", FAIL, "torch is not installed")
    import torch  # importing torch does not initialise CUDA; is_available() is NVML-based under vLLM

    cuda = getattr(torch.version, "cuda", None)
    if not cuda:
        return Check("cuda", FAIL, f"torch {torch.__version__} is built without CUDA")
    return Check("cuda", PASS, f"torch built for CUDA {cuda}")


def check_triton() -> Check:
    v = _version("triton")
    return Check("triton", PASS if v else FAIL, v or "triton is not installed")


def ptxas_path(env: dict | None = None) -> str | None:
    # TRITON_PTXAS_PATH: Triton's variable, reported by the doctor
    env = contract.environment() if env is None else env
    if env.get("TRITON_PTXAS_PATH"):
        return env["TRITON_PTXAS_PATH"]
    spec = importlib.util.find_spec("triton")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "backends", "nvidia", "bin", "ptxas")
    return path if os.path.exists(path) else None


def check_ptxas() -> Check:
    path = ptxas_path()
    if not path:
        return Check("ptxas", FAIL, "no TRITON_PTXAS_PATH and no ptxas bundled with triton")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return Check("ptxas", FAIL, f"{path} does not run ({type(exc).__name__})")
    m = re.search(r"release ([0-9.]+)", out)
    return Check("ptxas", PASS, f"{path} (CUDA {m.group(1) if m else '?'})")


def check_vllm() -> Check:
    v = _version("vllm")
    if not v:
        return Check("vllm", FAIL, f"vLLM is not installed (need {REQUIRED_VLLM})")
    if v.split("+")[0] != REQUIRED_VLLM:
        return Check("vllm", FAIL, f"vLLM {v} is installed; this plugin is built for {REQUIRED_VLLM}")
    return Check("vllm", PASS, v)


def read_gpus() -> list[dict]:
    """GPUs via NVML (no CUDA context). Raises RuntimeError with a short reason."""
    try:
        import pynvml
    except ImportError:
        raise RuntimeError("nvidia-ml-py is not installed") from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise RuntimeError(f"NVML is unavailable ({exc}); no NVIDIA driver or GPU visible") from None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            gpus.append({"index": i, "name": name.decode() if isinstance(name, bytes) else name,
                         "compute_capability": f"{major}.{minor}", "memory_total_mib": mem.total // 2**20})
        return gpus
    finally:
        pynvml.nvmlShutdown()


MIN_COMPUTE_CAPABILITY = "7.5"   # the oldest that FlashInfer and vLLM 0.21's AWQ-Marlin support


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = str(text).partition(".")
    return int(major), int(minor or 0)


def check_gpus(gpus: list[dict] | None = None) -> Check:
    """The GPUs NVML reports (or `gpus`, same fields as read_gpus)."""
    if gpus is None:
        try:
            gpus = read_gpus()
        except RuntimeError as exc:
            return Check("gpus", FAIL, str(exc))
    if not gpus:
        return Check("gpus", FAIL, "NVML reports no GPU")
    caps = sorted({g["compute_capability"] for g in gpus}, key=_cc)
    desc = "; ".join(f"{g['index']}: {g['name']} sm_{g['compute_capability'].replace('.', '')} "
                     f"{g['memory_total_mib']} MiB" for g in gpus)
    if len(caps) > 1:
        return Check("gpus", WARN, f"mixed compute capabilities {caps}: {desc}")
    if _cc(caps[0]) < _cc(MIN_COMPUTE_CAPABILITY):
        return Check("gpus", FAIL, below_minimum_sentence(gpus))
    return Check("gpus", PASS, desc)


def below_minimum_sentence(gpus: list[dict]) -> str:
    """One sentence: which GPUs, their compute capability and the minimum (all `gpus` share one capability)."""
    cc = gpus[0]["compute_capability"]
    names = sorted({g["name"] for g in gpus})
    which = (f"GPU {gpus[0]['index']} ({names[0]}) has" if len(gpus) == 1 else
             f"GPUs {', '.join(str(g['index']) for g in gpus)} ({', '.join(names)}) have")
    return (f"{which} compute capability {cc} (sm_{cc.replace('.', '')}), below the minimum of "
            f"{MIN_COMPUTE_CAPABILITY} (sm_{MIN_COMPUTE_CAPABILITY.replace('.', '')}) that FlashInfer and "
            "vLLM 0.21's AWQ-Marlin need.")


def check_entry_point() -> Check:
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "turingbox"]
    if not eps:
        return Check("plugin entry point", FAIL, "vllm.general_plugins has no 'turingbox' (pip install ./plugin)")
    if eps[0].value != "turingbox_plugin:register":
        return Check("plugin entry point", FAIL, f"'turingbox' points at {eps[0].value}")
    # VLLM_PLUGINS: vLLM's variable, reported by the doctor
    disabled = contract.variable("VLLM_PLUGINS")
    if disabled is not None and "turingbox" not in disabled.split(","):
        return Check("plugin entry point", WARN, f"discoverable, but VLLM_PLUGINS={disabled!r} excludes it")
    return Check("plugin entry point", PASS, "turingbox -> turingbox_plugin:register")


def vllm_source_dir() -> str | None:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def check_gdn_interface(root: str | None = None) -> Check:
    root = root or vllm_source_dir()
    if not root:
        return Check("gdn interface", FAIL, "vLLM is not installed")
    missing = []
    for rel, symbol in GDN_INTERFACE:
        try:
            with open(os.path.join(root, rel), encoding="utf-8") as f:
                if symbol not in f.read():
                    missing.append(f"{rel}: {symbol}")
        except OSError:
            missing.append(rel)
    if missing:
        return Check("gdn interface", FAIL, "missing " + ", ".join(missing))
    return Check("gdn interface", PASS, f"{len(GDN_INTERFACE)} entry points present in {root}")


def check_model(model_dir: str) -> Check:
    try:
        m = load_model_config(model_dir)
    except ToolError as exc:
        return Check("model", FAIL, str(exc))
    return Check("model", PASS, f"{m.architecture}, {m.num_hidden_layers} layers "
                                f"({m.num_linear_attention_layers} GDN), MTP layers {m.mtp_num_hidden_layers}, "
                                f"quantization {m.quantization.method if m.quantization else 'none'}")


# Checks that need more than the plugin (the appliance's planner) come in through this entry-point group:
# each entry is a function (model_dir) -> Check, so the plugin imports nothing of the appliance. An entry
# that carries an `add_arguments(parser)` attribute adds its own doctor flags and is called
# (model_dir, args) with the parsed arguments.
EXTRA_CHECKS_GROUP = "turingbox_plugin.doctor_checks"


def extra_checks() -> list[tuple[str, Callable[..., Check]]]:
    from importlib.metadata import entry_points
    out = []
    for ep in entry_points(group=EXTRA_CHECKS_GROUP):
        try:
            out.append((ep.name, ep.load()))
        except Exception as exc:  # a broken extension is its own WARN line
            out.append((ep.name, lambda _m, exc=exc, name=ep.name: Check(name, WARN, f"not loadable ({exc})")))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """doctor's flags: MODEL, --json, and those of the extra checks (the appliance's --gpus-json)."""
    parser.add_argument("model", nargs="?", default=None, help="model directory to check and plan for")
    parser.add_argument("--json", action="store_true")
    for _name, fn in extra_checks():
        add = getattr(fn, "add_arguments", None)
        if add is not None:
            add(parser)


def run_checks(model_dir: str | None = None, args: argparse.Namespace | None = None) -> list[Check]:
    checks: list[tuple[str, Callable[[], Check]]] = [
        ("python", check_python), ("torch", check_torch), ("cuda", check_cuda_runtime),
        ("triton", check_triton), ("ptxas", check_ptxas), ("vllm", check_vllm), ("gpus", check_gpus),
        ("plugin entry point", check_entry_point), ("gdn interface", check_gdn_interface),
    ]
    if model_dir:
        checks.append(("model", lambda: check_model(model_dir)))
    for name, fn in extra_checks():
        if getattr(fn, "add_arguments", None) is not None:
            checks.append((name, (lambda fn=fn: fn(model_dir, args))))
        else:
            checks.append((name, (lambda fn=fn: fn(model_dir))))
    out = []
    for name, fn in checks:
        try:
            out.append(fn())
        except Exception as exc:  # a broken environment is a FAIL line, never a traceback
            out.append(Check(name, FAIL, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"))
    return out


def as_json(checks: list[Check]) -> dict:
    return {"ok": all(c.status != FAIL for c in checks), "checks": [asdict(c) for c in checks]}
