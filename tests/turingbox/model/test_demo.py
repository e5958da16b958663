"""`turingbox demo-model`: config, real tokenizer (ids == tiktoken ranks), chat template, atomic writes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from turingbox.errors import UsageError
from turingbox.model import demo
from turingbox.model import tokenizer as demo_tokenizer
from turingbox_plugin.model_config import DEMO_MARKER, load_model_config

LISTED_IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046,
              "<think>": 248068, "</think>": 248069, "<tool_call>": 248058, "</tool_call>": 248059,
              "<tool_response>": 248066, "</tool_response>": 248067, "<|vision_start|>": 248053,
              "<|image_pad|>": 248056, "<|video_pad|>": 248057}

SAMPLES = [
    "Hello, world! It's a test; they'll see.",
    "你好，世界！今天的天气怎么样？我们去公园散步吧。",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # 递归\n\n\n",
    "emoji 😀👍🏽🇯🇵 family 👨‍👩‍👧‍👦 ok✅",
    "naïve café, हिन्दी, العربية, 한국어, Ελληνικά, ไทย",
    "  leading   spaces\t\ttabs\r\n\r\nwindows 1234567890 3.14159e-10",
    "<|im_start|>user\nhi<|im_end|>\n<think>\nhmm</think><tool_call>{}</tool_call>",
    "{\"json\": [1, 2, {\"k\": null}], 'x': true}\n```python\nprint('x')\n```",
]


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def full_demo(models_dir):
    """The full 64-layer demo; builds the tokenizer once for the whole session (cache beside it)."""
    return demo.ensure_demo_model(os.path.join(models_dir, "full"))


@pytest.fixture(scope="session")
def hf_tokenizer(full_demo):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(full_demo)


@pytest.fixture(scope="session")
def tiktoken_reference():
    return demo_tokenizer.tiktoken_encoding()


# ---- config ---------------------------------------------------------------------------------

def test_full_demo_has_the_qwen36_27b_architecture(full_demo):
    m = load_model_config(full_demo)
    assert m.architecture == "Qwen3_5ForConditionalGeneration"
    assert (m.num_hidden_layers, m.num_attention_heads, m.num_key_value_heads, m.head_dim) == (64, 24, 4, 256)
    assert (m.linear_num_key_heads, m.linear_num_value_heads) == (16, 48)
    assert (m.num_full_attention_layers, m.num_linear_attention_layers) == (16, 48)
    assert m.mtp_num_hidden_layers == 1 and m.vocab_size == 248320 and m.hidden_size == 5120
    assert m.quantization is None and m.is_demo
    raw = m.extra["raw"]
    assert raw[DEMO_MARKER] == {"source": "qwen3.6-27b", "layers": 64, "awq": False}
    shipped = demo.base_config()
    assert raw["text_config"] == shipped["text_config"]
    assert raw["vision_config"] == shipped["vision_config"] and "quantization_config" not in raw


def test_layers_keep_every_fourth_layer_full_attention():
    cfg = demo.make_config(layers=8)
    text = cfg["text_config"]
    assert text["num_hidden_layers"] == 8
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    assert cfg[DEMO_MARKER]["layers"] == 8
    assert demo.base_config()["text_config"]["num_hidden_layers"] == 64   # the shipped data is untouched


def test_awq_small_demo_loads_with_quantization(models_dir, full_demo):
    path = demo.ensure_demo_model(os.path.join(models_dir, "awq8"), awq=True, layers=8)
    m = load_model_config(path)
    assert m.num_hidden_layers == 8 and m.num_full_attention_layers == 2
    assert m.quantization is not None
    assert (m.quantization.method, m.quantization.bits, m.quantization.group_size) == ("awq", 4, 128)
    assert m.quantization.modules_to_not_convert == ("visual", "mtp", "in_proj_ba")
    q = m.extra["raw"]["quantization_config"]
    assert q["zero_point"] is True and q["version"] == "gemm"
    assert m.extra["raw"][DEMO_MARKER] == {"source": "qwen3.6-27b", "layers": 8, "awq": True}


@pytest.mark.parametrize("layers", [0, -4, 6, 3, 66])
def test_layers_must_be_a_positive_multiple_of_four(layers, tmp_path):
    with pytest.raises(UsageError) as exc:
        demo.ensure_demo_model(str(tmp_path / "demo"), layers=layers)
    msg = str(exc.value)
    assert "--layers" in msg and repr(layers) in msg and "multiple of 4" in msg and "\n" not in msg
    assert not (tmp_path / "demo").exists()


# ---- tokenizer --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_ids_equal_tiktoken_ranks(text, full_demo, hf_tokenizer, tiktoken_reference):
    from transformers import PreTrainedTokenizerFast
    expected = tiktoken_reference.encode(text, allowed_special="all")
    assert expected == demo_tokenizer.reference_encode(text)       # the package's own encode
    assert hf_tokenizer.encode(text, add_special_tokens=False) == expected
    fast = _fast_tokenizer(full_demo)
    assert fast.encode(text, add_special_tokens=False) == expected
    assert hf_tokenizer.decode(expected) == text


def test_tokenizer_normalises_like_the_package(hf_tokenizer):
    decomposed = "cafe\u0301 n\u0303"                # NFD: the package NFC-normalises first
    assert hf_tokenizer.encode(decomposed, add_special_tokens=False) == demo_tokenizer.reference_encode(decomposed)


_FAST = {}


def _fast_tokenizer(path):
    if path not in _FAST:
        from transformers import PreTrainedTokenizerFast
        _FAST[path] = PreTrainedTokenizerFast(tokenizer_file=os.path.join(path, "tokenizer.json"))
    return _FAST[path]


def test_special_tokens_have_the_listed_ids(hf_tokenizer):
    for token, token_id in LISTED_IDS.items():
        assert hf_tokenizer.convert_tokens_to_ids(token) == token_id, token
        assert hf_tokenizer.encode(token, add_special_tokens=False) == [token_id]
    package = demo_tokenizer.special_tokens()
    assert len(package) == 33 and min(package.values()) == 248044 and max(package.values()) == 248076
    for token, token_id in package.items():
        assert hf_tokenizer.convert_tokens_to_ids(token) == token_id, token
    assert hf_tokenizer.eos_token == "<|im_end|>" and hf_tokenizer.eos_token_id == 248046
    assert hf_tokenizer.pad_token == "<|endoftext|>" and hf_tokenizer.pad_token_id == 248044
    assert len(hf_tokenizer) == 248077 <= 248320              # fits the model's (padded) vocab


def test_tokenizer_files_and_generation_config(full_demo):
    cfg = json.load(open(os.path.join(full_demo, "tokenizer_config.json")))
    assert cfg["tokenizer_class"] in ("PreTrainedTokenizerFast", "Qwen2TokenizerFast")
    assert cfg["model_max_length"] == 262144
    assert cfg["chat_template"] == open(os.path.join(full_demo, "chat_template.jinja")).read()
    gen = json.load(open(os.path.join(full_demo, "generation_config.json")))
    assert gen["eos_token_id"][0] == 248046 and gen["pad_token_id"] == 248044
    pre = json.load(open(os.path.join(full_demo, "preprocessor_config.json")))
    assert (pre["patch_size"], pre["merge_size"], pre["temporal_patch_size"]) == (16, 2, 2)


# ---- chat template ----------------------------------------------------------------------------

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def test_chat_template_renders_tools_thinking_and_tool_results(hf_tokenizer):
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should call the tool twice.",
         "tool_calls": [
             {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
             {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
        {"role": "tool", "content": "18C sunny"},
        {"role": "tool", "content": "25C clear"},
    ]
    text = hf_tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    # The system turn carries the system prompt, then the tool signatures as JSON inside <tools>.
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    tools_block = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert json.loads(tools_block) == TOOLS[0]
    assert text.index("</tools>") < text.index("<|im_end|>\n<|im_start|>user\nWeather in Paris and Rome?<|im_end|>")
    # The assistant turn after the last query keeps its reasoning, then one JSON call per block.
    assistant = text.split("<|im_start|>assistant\n", 1)[1].split("<|im_end|>", 1)[0]
    assert assistant.startswith("<think>\nI should call the tool twice.\n</think>\n\n")
    calls = [json.loads(block.split("</tool_call>")[0]) for block in assistant.split("<tool_call>\n")[1:]]
    assert calls == [{"name": "get_weather", "arguments": {"city": "Paris"}},
                     {"name": "get_weather", "arguments": {"city": "Rome"}}]
    # Consecutive tool results share one user turn, each in <tool_response>.
    assert ("<|im_start|>user\n<tool_response>\n18C sunny\n</tool_response>\n"
            "<tool_response>\n25C clear\n</tool_response><|im_end|>\n") in text
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    assert ids.count(248058) == 4 and ids.count(248059) == 4        # 2 calls + 2 in the instructions
    assert ids.count(248066) == 2 and ids[-2:] == [248068, hf_tokenizer.encode("\n", add_special_tokens=False)[0]]


def test_chat_template_thinking_switch_and_history(hf_tokenizer):
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "<think>\nold reasoning\n</think>\n\nfirst answer"},
        {"role": "user", "content": "second"},
    ]
    off = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                           enable_thinking=False)
    on = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    # Reasoning of turns before the last user query is dropped from the history.
    assert "old reasoning" not in on and "<|im_start|>assistant\nfirst answer<|im_end|>\n" in on
    assert not on.startswith("<|im_start|>system")                  # no tools, no system: none invented
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert on.endswith("<|im_start|>assistant\n<think>\n")
    assert off.count("<|im_start|>") == on.count("<|im_start|>") == 4


# ---- idempotence and atomicity ----------------------------------------------------------------

def _snapshot(path):
    return {n: os.stat(os.path.join(path, n)).st_ino for n in sorted(os.listdir(path))}


def test_existing_demo_is_reused_and_other_options_rebuild(models_dir, full_demo):
    target = os.path.join(models_dir, "reuse")
    first = demo.ensure_demo_model(target, layers=4)
    before = _snapshot(first)
    assert demo.ensure_demo_model(target, layers=4) == first
    assert _snapshot(first) == before                              # nothing rewritten
    demo.ensure_demo_model(target, layers=4, awq=True)
    assert load_model_config(target).quantization.method == "awq"
    assert _snapshot(target) != before
    assert sorted(os.listdir(target)) == sorted(demo.DEMO_FILES)
    leftovers = [n for n in os.listdir(models_dir) if ".build-" in n or ".old-" in n]
    assert leftovers == []


def test_demo_of_an_older_format_or_with_a_missing_file_is_rebuilt(models_dir, full_demo):
    target = demo.ensure_demo_model(os.path.join(models_dir, "stale"), layers=4)
    cfg_path = os.path.join(target, "config.json")
    cfg = json.load(open(cfg_path))
    cfg[demo.DEMO_FORMAT_KEY] = demo.DEMO_FORMAT_VERSION - 1
    json.dump(cfg, open(cfg_path, "w"))
    demo.ensure_demo_model(target, layers=4)
    assert json.load(open(cfg_path))[demo.DEMO_FORMAT_KEY] == demo.DEMO_FORMAT_VERSION
    os.remove(os.path.join(target, "tokenizer.json"))
    demo.ensure_demo_model(target, layers=4)
    assert os.path.getsize(os.path.join(target, "tokenizer.json")) > 10_000_000


def test_failure_while_writing_leaves_nothing_at_the_target(models_dir, full_demo, monkeypatch):
    target = os.path.join(models_dir, "interrupted")

    def broken_write(path, obj):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(demo, "_write_json", broken_write)
    with pytest.raises(OSError):
        demo.ensure_demo_model(target, layers=4)
    assert not os.path.exists(target)
    assert [n for n in os.listdir(models_dir) if n.startswith(".interrupted.") and not n.endswith(".lock")] == []


def test_failed_rebuild_keeps_the_previous_demo(models_dir, full_demo, monkeypatch):
    target = demo.ensure_demo_model(os.path.join(models_dir, "keep"), layers=4)
    before = _snapshot(target)
    monkeypatch.setattr(demo.demo_tokenizer, "copy_tokenizer_files",
                        lambda out_dir, parent: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        demo.ensure_demo_model(target, layers=8)
    assert _snapshot(target) == before and load_model_config(target).num_hidden_layers == 4


def test_refuses_to_replace_a_directory_that_is_not_a_demo(tmp_path):
    target = tmp_path / "my-real-model"
    target.mkdir()
    (target / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(UsageError, match="is not a turingbox demo model"):
        demo.ensure_demo_model(str(target), layers=4)
    assert (target / "config.json").read_text() == '{"model_type": "llama"}'


# ---- CLI --------------------------------------------------------------------------------------

def _cli(*args, env=None):
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "turingbox", "demo-model", *args],
                          capture_output=True, text=True, env=full_env, timeout=120)


@pytest.mark.parametrize("args,env,names", [
    (["--layers", "6"], {}, "--layers"),
    (["--layers", "four"], {}, "--layers"),
    ([], {"TURINGBOX_DEMO_LAYERS": "10"}, "TURINGBOX_DEMO_LAYERS"),
    ([], {"TURINGBOX_DEMO_AWQ": "maybe"}, "TURINGBOX_DEMO_AWQ"),
])
def test_cli_bad_input_exits_2_with_one_sentence(args, env, names, tmp_path):
    target = str(tmp_path / "demo")
    r = _cli(target, *args, env=env)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and names in lines[0] and "Traceback" not in r.stderr
    assert not os.path.exists(target)


def test_cli_writes_a_small_awq_demo_into_models_dir(models_dir, full_demo):
    r = _cli("--awq", "--layers", "4", "--models-dir", models_dir)   # reuses the session's tokenizer cache
    assert r.returncode == 0, r.stderr
    path = os.path.join(models_dir, demo.DEMO_DIR_NAME)
    assert path in r.stdout
    m = load_model_config(path)
    assert m.num_hidden_layers == 4 and m.quantization.method == "awq" and m.is_demo


def test_cli_tokenizer_only_prepares_the_cache_and_no_model(models_dir, full_demo):
    target = os.path.join(models_dir, "later")
    r = _cli(target, "--tokenizer-only")
    assert r.returncode == 0, r.stderr
    assert demo_tokenizer.cache_dir_for(models_dir) in r.stdout
    assert not os.path.exists(target)
