"""vLLM 0.21's failure lines -> one sentence with the cause and the remedy, for the line serve prints when vLLM
dies (what the on-call engineer reads first, before vLLM's traceback).

vLLM's root cause is often far above its last lines: an engine that cannot size its KV cache logs the number,
then a ValueError, then ~60 lines of traceback from both processes. So every line is observed as it streams and
the first one that names a known cause is kept. The patterns are vLLM 0.21.0's own messages
(v1/worker/gpu_worker.py, v1/worker/utils.py request_memory, v1/core/kv_cache_utils.py, torch's OOM error).
"""
from __future__ import annotations

import re
from typing import Callable

from turingbox.settings import REGISTRY

_UTIL = REGISTRY["gpu_memory_utilization"].env_name
_CONTEXT = REGISTRY["max_model_len"].env_name
_SEQS = REGISTRY["max_num_seqs"].env_name
_NUM = r"([\d.]+)"

# (pattern, sentence from its match), in no particular order: the first line that matches any of them wins.
RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (re.compile(r"Available KV cache memory: (-[\d.]+) GiB"),
     lambda m: (f"vLLM found {m[1]} GiB left for its KV cache: GPU memory was taken while it measured "
                f"(another server starting or stopping on the same GPU: start them one at a time), or the "
                f"weights and activations do not fit its share (raise {_UTIL}).")),
    (re.compile(r"No available memory for the cache blocks"),
     lambda m: (f"vLLM found no memory left for its KV cache: GPU memory was taken while it measured "
                f"(another server starting or stopping on the same GPU: start them one at a time), or the "
                f"weights and activations do not fit its share (raise {_UTIL}).")),
    (re.compile(rf"Free memory on device \S* ?\({_NUM}/{_NUM} GiB\) on startup is less than desired GPU "
                rf"memory utilization \({_NUM}, {_NUM} GiB\)"),
     lambda m: (f"Only {m[1]} of {m[2]} GiB of the GPU were free when vLLM started, less than the {m[4]} GiB "
                f"its share {m[3]} asks for: another process holds GPU memory (nvidia-smi lists it); stop it "
                f"or lower {_UTIL}.")),
    (re.compile(rf"max seq len \((\d+)\), \({_NUM} GiB KV cache is needed, which is larger than the available "
                rf"KV cache memory \({_NUM} GiB\)\.(?: Based on the available memory, the estimated maximum model "
                rf"length is (\d+)\.)?"),
     lambda m: (f"A {m[1]}-token context needs {m[2]} GiB of KV cache but vLLM had {m[3]} GiB left"
                + (f" (enough for {m[4]} tokens)" if m[4] else "")
                + f": set {_CONTEXT} lower, or raise {_UTIL}, or free the GPU of other processes.")),
    (re.compile(r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB)"),
     lambda m: (f"The GPU ran out of memory (vLLM tried to allocate {m[1]}): lower {_UTIL} or {_SEQS}, or free "
                f"the GPU of other processes.")),
)


class FailureDiagnosis:
    """Fed every line of vLLM's output; `sentence` is the first known cause seen, or None."""

    def __init__(self) -> None:
        self.sentence: str | None = None

    def observe(self, line: str) -> None:
        if self.sentence is not None:
            return
        for pattern, explain in RULES:
            match = pattern.search(line)
            if match:
                self.sentence = explain(match)
                return
