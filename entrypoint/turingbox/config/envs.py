"""Every environment variable the appliance reads that is not one of its settings (config/table.py), declared
once with who reads it, and read only here (like vLLM's vllm/envs.py). The settings are TURINGBOX_* variables with
a flag, loaded by config.load; these are the container runtime's and CUDA's variables, the image build's knobs,
the host tools' and the whole environment the engine launcher hands to vLLM. Writes that steer a library through
its variable (Triton's cache dir, vLLM's cache root) go through `override` and `set_variable` below.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator, Mapping

# name -> who reads it, and why
VARIABLES: dict[str, str] = {
    # build and host tools, never read by `turingbox serve`
    "TURINGBOX_VLLM_SRC": "vLLM's source for the AOT spec derivations and compile checks",
    "TURINGBOX_FLASHINFER_SRC": "FlashInfer's source for its module derivation",
    "TURINGBOX_CUDA_EXTRA_INCLUDE": "extra CUDA headers for the FlashInfer ahead-of-time build",
    "TURINGBOX_CACHE_VOLUME": "the Docker volume `make warmup-cache` seeds",
    "CC": "the image build's C compiler (Triton's launchers, the FlashInfer stub library)",
    "CUDA_HOME": "the CUDA toolkit of the FlashInfer ahead-of-time build",
    "CUDA_PATH": "the CUDA toolkit of the FlashInfer ahead-of-time build (CUDA_HOME's other name)",
    "TRITON_CACHE_DIR": "Triton's cache dir, swapped around the image build's compiles",
    "VLLM_CACHE_ROOT": "vLLM's cache root, set for the image build's model-class inspection",
    # GPU visibility (gpus/): the container runtime's and CUDA's
    "NVIDIA_VISIBLE_DEVICES": "the GPUs the container runtime exposes",
    "CUDA_VISIBLE_DEVICES": "the GPUs CUDA enumerates, in its order",
}
GPU_VISIBILITY = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")


def _text(name: str) -> str | None:
    """A declared variable's value; None when unset or empty."""
    assert name in VARIABLES, f"{name} is not declared in config/envs.py"
    return os.environ.get(name) or None


def vllm_src() -> str | None:
    return _text("TURINGBOX_VLLM_SRC")


def flashinfer_src() -> str | None:
    return _text("TURINGBOX_FLASHINFER_SRC")


def cuda_extra_include() -> list[str]:
    return [d for d in (_text("TURINGBOX_CUDA_EXTRA_INCLUDE") or "").split(os.pathsep) if d]


def cache_volume(default: str) -> str:
    return _text("TURINGBOX_CACHE_VOLUME") or default


def c_compiler() -> str:
    return _text("CC") or "gcc"


def cuda_homes() -> tuple[str | None, str | None]:
    """(CUDA_HOME, CUDA_PATH), the FlashInfer build's candidates in that order."""
    return _text("CUDA_HOME"), _text("CUDA_PATH")


def gpu_visibility() -> dict[str, str]:
    """NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES as set (an empty value kept: it means no GPU to CUDA)."""
    return {name: os.environ[name] for name in GPU_VISIBILITY if name in os.environ}


def process_environment() -> Mapping[str, str]:
    """This process's whole environment: what the engine launcher hands to vLLM (engine/launch.py:parent_env),
    what the host tools forward into their containers and what the image build hands its compilers."""
    return os.environ


@contextlib.contextmanager
def override(name: str, value: str) -> Iterator[None]:
    """Set a declared variable for the duration (a library reads it from the process environment), then restore
    it as it was."""
    assert name in VARIABLES, f"{name} is not declared in config/envs.py"
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def set_variable(name: str, value: str) -> None:
    """Set a declared variable for the rest of the process (a library reads it later, when it asks)."""
    assert name in VARIABLES, f"{name} is not declared in config/envs.py"
    os.environ[name] = value
