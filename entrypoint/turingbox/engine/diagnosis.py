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

from turingbox.config import REGISTRY

_UTIL = REGISTRY["gpu_memory_utilization"].env_name
_CONTEXT = REGISTRY["max_model_len"].env_name
_SEQS = REGISTRY["max_num_seqs"].env_name
_NUM = r"([\d.]+)"
# Only vLLM's own lines: its process prefix, its log header, then the message (or a traceback's exception line),
# from the start of the line, so text a client sent that vLLM echoes inside a message cannot pose as a cause.
_VLLM = r"^(?:\(\w+ pid=\d+\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d [\d:]+ \[[\w.]+:\d+\] )?"
_FREE_GPU = "another process holds GPU memory (nvidia-smi lists it)"
_TAKEN = (f"GPU memory was taken while it measured (another server starting or stopping on the same GPU: start them "
          f"one at a time), or the weights and activations do not fit its share (raise {_UTIL}).")


def _rule(message: str) -> re.Pattern[str]:
    return re.compile(_VLLM + message)


# (pattern, sentence from its match): the first line that matches any of them wins.
RULES: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], str]], ...] = (
    (_rule(r"Available KV cache memory: (-[\d.]+) GiB"),
     lambda m: f"vLLM found {m[1]} GiB left for its KV cache: {_TAKEN}"),
    (_rule(r"(?:ValueError: )?No available memory for the cache blocks"),
     lambda m: f"vLLM found no memory left for its KV cache: {_TAKEN}"),
    (_rule(rf"(?:ValueError: )?Free memory on device \S* ?\({_NUM}/{_NUM} GiB\) on startup is less than desired "
           rf"GPU memory utilization \({_NUM}, {_NUM} GiB\)"),
     lambda m: (f"Only {m[1]} of {m[2]} GiB of the GPU were free when vLLM started, less than the {m[4]} GiB "
                f"its share {m[3]} asks for: {_FREE_GPU}; stop it or lower {_UTIL}.")),
    (_rule(rf"(?:ValueError: )?To serve at least one request with the models's max seq len \((\d+)\), \({_NUM} GiB "
           rf"KV cache is needed, which is larger than the available KV cache memory \({_NUM} GiB\)\.(?: Based on "
           rf"the available memory, the estimated maximum model length is (\d+)\.)?"),
     lambda m: (f"A {m[1]}-token context needs {m[2]} GiB of KV cache but vLLM had {m[3]} GiB left"
                + (f" (enough for {m[4]} tokens)" if m[4] else "")
                + f": set {_CONTEXT} lower, or raise {_UTIL}, or free the GPU of other processes.")),
    (_rule(r"Failed to load model - not enough GPU memory"),
     lambda m: (f"The weights did not fit in the GPU memory left while loading: {_FREE_GPU}, or the model needs "
                f"more GPUs.")),
    (_rule(r"(?:torch\.)?(?:cuda\.)?OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB)"),
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
