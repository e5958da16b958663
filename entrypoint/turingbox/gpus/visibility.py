"""NVIDIA_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES, in all their forms, applied to an inventory.

Forms understood: indices ("0,2"), full UUIDs ("GPU-8932f937-d72c-..."), unique UUID prefixes
("GPU-8932f937", as CUDA accepts), "all", "none", "void", "" and "-1". MIG devices ("MIG-...",
"MIG-GPU-.../1/0", "0:1") are refused: the planner needs whole GPUs for tensor parallelism.

Order of application, as on a real machine: the container runtime applies NVIDIA_VISIBLE_DEVICES
(host indices or UUIDs), then CUDA applies CUDA_VISIBLE_DEVICES to what is left, where an index is
a position in CUDA order. turingbox always runs vLLM with CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA
order here is PCI bus order (the same order nvidia-smi and NVML number GPUs in).
"""
from __future__ import annotations

import re
from typing import Mapping, Sequence

from turingbox.errors import PlanError, UsageError
from turingbox.gpus.device import Gpu, pci_sort_key

ALL = "all"
NONE_WORDS = ("none", "void")
_MIG = re.compile(r"^(mig-.*|\d+:\d+)$", re.IGNORECASE)
_INDEX = re.compile(r"^-?\d+$")


def parse_tokens(variable: str, value: str) -> list[str] | None:
    """None means "all GPUs"; [] means "no GPU"; otherwise the listed tokens, in order."""
    text = value.strip()
    if text.lower() == ALL:
        return None
    if text.lower() in NONE_WORDS or text == "":
        return []
    tokens = [t.strip() for t in text.split(",")]
    if any(t == "" for t in tokens):
        raise UsageError(f"{variable} {value!r} has an empty entry; list GPU indices or UUIDs separated by commas.")
    for t in tokens:
        if _MIG.match(t):
            raise PlanError(f"{variable} selects the MIG device {t}; turingbox plans tensor parallelism on "
                            "whole GPUs only, so list whole GPUs (indices or GPU- UUIDs).")
    if tokens and tokens[0] == "-1":
        return []          # CUDA's customary "hide every GPU"
    return tokens


def _resolve(variable: str, tokens: Sequence[str], gpus: Sequence[Gpu], by_position: bool) -> list[Gpu]:
    """Map tokens to GPUs: an index is a position (CUDA) or an NVML/host index (NVIDIA runtime)."""
    chosen: list[Gpu] = []
    for t in tokens:
        if _INDEX.match(t):
            i = int(t)
            if by_position:
                if not 0 <= i < len(gpus):
                    raise UsageError(f"{variable} lists GPU {i}, but only {len(gpus)} GPU(s) are visible "
                                     f"at that point (indices 0-{len(gpus) - 1})." if gpus else
                                     f"{variable} lists GPU {i}, but no GPU is visible at that point.")
                gpu = gpus[i]
            else:
                match = [g for g in gpus if g.index == i]
                if not match:
                    raise UsageError(f"{variable} lists GPU index {i}, which is not among the GPUs found "
                                     f"(indices {', '.join(str(g.index) for g in gpus) or 'none'}).")
                gpu = match[0]
        else:
            if not t.upper().startswith("GPU-"):
                raise UsageError(f"{variable} entry {t!r} is neither a GPU index nor a GPU- UUID.")
            match = [g for g in gpus if g.uuid.lower().startswith(t.lower())]
            if not match:
                raise UsageError(f"{variable} lists {t}, which matches none of the GPUs found.")
            if len(match) > 1:
                raise UsageError(f"{variable} entry {t} matches {len(match)} GPUs; give more of the UUID.")
            gpu = match[0]
        if gpu in chosen:
            raise UsageError(f"{variable} lists GPU {t} twice.")
        chosen.append(gpu)
    return chosen


def apply_visibility(gpus: Sequence[Gpu], env: Mapping[str, str]) -> tuple[list[Gpu], list[dict], str]:
    """(visible GPUs in PCI order, [{uuid, index, reason}] of the hidden ones, one-line note)."""
    gpus = sorted(gpus, key=pci_sort_key)
    hidden: list[dict] = []
    notes: list[str] = []
    visible = list(gpus)

    nvidia = env.get("NVIDIA_VISIBLE_DEVICES")
    if nvidia is not None and nvidia.strip() != "":
        tokens = parse_tokens("NVIDIA_VISIBLE_DEVICES", nvidia)
        if tokens is None:
            pass
        elif (tokens and len(tokens) == len(visible)
              and any(_INDEX.match(t) for t in tokens)
              and not _all_resolve(tokens, visible)):
            # Inside a container the runtime already applied it and NVML renumbered the GPUs from 0:
            # host indices no longer match, but the count does.
            notes.append("NVIDIA_VISIBLE_DEVICES already applied by the container runtime")
        else:
            kept = _resolve("NVIDIA_VISIBLE_DEVICES", tokens, visible, by_position=False)
            hidden += [_hidden(g, "not in NVIDIA_VISIBLE_DEVICES") for g in visible if g not in kept]
            visible = sorted(kept, key=pci_sort_key)
            notes.append(f"NVIDIA_VISIBLE_DEVICES={nvidia.strip()}")

    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        tokens = parse_tokens("CUDA_VISIBLE_DEVICES", cuda)
        if tokens is not None:
            kept = _resolve("CUDA_VISIBLE_DEVICES", tokens, visible, by_position=True)
            hidden += [_hidden(g, "not in CUDA_VISIBLE_DEVICES") for g in visible if g not in kept]
            visible = sorted(kept, key=pci_sort_key)
            notes.append(f"CUDA_VISIBLE_DEVICES={cuda.strip()!r}" if not cuda.strip()
                         else f"CUDA_VISIBLE_DEVICES={cuda.strip()}")
    return visible, hidden, "; ".join(notes) or "all GPUs visible"


def _all_resolve(tokens: Sequence[str], gpus: Sequence[Gpu]) -> bool:
    try:
        _resolve("NVIDIA_VISIBLE_DEVICES", tokens, gpus, by_position=False)
        return True
    except UsageError:
        return False


def _hidden(gpu: Gpu, reason: str) -> dict:
    return {"uuid": gpu.uuid, "index": gpu.index, "reason": reason}


def cuda_visible_devices(chosen: Sequence[Gpu]) -> str:
    """Value for the vLLM process: NVML indices in PCI order.

    Indices, not UUIDs: vLLM 0.21 maps a device through `int(CUDA_VISIBLE_DEVICES[i])` to an NVML
    handle (platforms/interface.py device_id_to_physical_device_id), so UUIDs there break it.
    """
    return ",".join(str(g.index) for g in sorted(chosen, key=pci_sort_key))
