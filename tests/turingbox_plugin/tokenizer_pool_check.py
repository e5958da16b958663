"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU): vLLM's real maybe_make_thread_pool and
CoreEngineProcManager, before and after turingbox_plugin.vllm_fixes.defer_tokenizer_pool, on a small fast
tokenizer built with the `tokenizers` library. The engine start is vLLM's CoreEngineProcManager.__init__ with its
process launch replaced by a recorder (no engine process on a CPU machine). argv: vllm_root mode (unpatched |
patched | moved | renderer-first: vllm.renderers.hf imported before the patch | client: an API server whose engines
another process started, so only vLLM's MPClient is built here | no-hook: the engine-start hooks fail).
Prints one JSON object."""
import copy
import json
import pickle
import logging
import os
import sys
import threading
import time

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
mode = sys.argv[2]

from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast  # noqa: E402

import vllm.tokenizers.hf as tokenizers_hf  # noqa: E402
from vllm.v1.engine.core_client import MPClient  # noqa: E402
from vllm.v1.engine.utils import CoreEngineProcManager  # noqa: E402

if mode == "renderer-first":
    import vllm.renderers.hf as renderers_first  # noqa: E402,F401

from turingbox_plugin import vllm_fixes  # noqa: E402

said = []


class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


logging.getLogger("vllm").addHandler(Said())

deepcopies = []
real_deepcopy = copy.deepcopy


def counting_deepcopy(obj, memo=None, _nil=[]):
    if memo is None and isinstance(obj, PreTrainedTokenizerFast):   # the pool's copies (top-level calls only)
        deepcopies.append(threading.current_thread().name)
    return real_deepcopy(obj, memo)


copy.deepcopy = counting_deepcopy


def tokenizer():
    words = ["[UNK]", "hello", "world", "the", "pool", "fills", "later"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


started = []


def vllm_init_standin(self, *args, **kwargs):        # where vLLM starts its engine processes
    started.append(threading.active_count())


CoreEngineProcManager.__init__ = vllm_init_standin
clients = []


def mp_client_standin(self, *args, **kwargs):        # vLLM's client: connects to engines, here it only records
    clients.append(threading.current_thread().name)


MPClient.__init__ = mp_client_standin
out = {}
if mode == "moved":
    vllm_fixes.POOL_FILLED_AT_ONCE = "    tokenizer_pool.put_many(copies)"
if mode == "no-hook":                              # vLLM's engine start moved: the hooks cannot be installed
    def moved():
        raise ImportError("cannot import name 'CoreEngineProcManager'")
    vllm_fixes._hook_engine_start = moved
if mode != "unpatched":
    out["applied"] = vllm_fixes.defer_tokenizer_pool()
    out["applied_again"] = vllm_fixes.defer_tokenizer_pool()
    out["module_attribute_is_patched"] = getattr(tokenizers_hf.maybe_make_thread_pool, "_turingbox_deferred", False)

tok = tokenizer()
text = "hello world the pool fills later"
expected = tok.encode(text)
threads_before = threading.active_count()
t0 = time.perf_counter()
tokenizers_hf.maybe_make_thread_pool(tok, 2)
out["pool_class"] = type(tok).__name__
out["copies_before_engine_start"] = len(deepcopies)
out["threads_started_before_engine_start"] = threading.active_count() - threads_before
pool = vllm_fixes._pool_of(tok)
out["pool_found"] = pool is not None
out["queued_before_engine_start"] = pool[0].qsize() if pool else None

if mode == "client":
    MPClient(None)                                 # no engine process started here: filled before the client returns
    out["client_ran"] = clients == ["MainThread"]
else:
    CoreEngineProcManager(None)                    # vLLM's engine start (the stand-in above), through the wrapper
    MPClient(None)                                 # then vLLM's client, as in AsyncLLM: nothing more to fill
out["vllm_start_ran"] = len(started) == 1
deadline = time.monotonic() + 60
while time.monotonic() < deadline and (
        (pool and pool[0].qsize() < 2) or
        (mode in ("patched", "renderer-first") and not any("tokenizer pool filled" in m for m in said))):
    time.sleep(0.01)  # poll: until the pool is filled or the deadline passes (a child: no tests package here)
out["copies_after_engine_start"] = len(deepcopies)
out["copy_threads"] = sorted(set(deepcopies))
out["queued_after_engine_start"] = pool[0].qsize() if pool else None
out["encode_same"] = tok.encode(text) == expected
out["decode_same"] = tok.decode(expected) == text
out["encode_copies_made"] = len(deepcopies) - out["copies_after_engine_start"]   # a borrow from a full pool: none

tok2 = tokenizer()                                 # a pool built once the engines run: filled at once, as vLLM does
n = len(deepcopies)
tokenizers_hf.maybe_make_thread_pool(tok2, 2)
out["copies_after_start_at_once"] = len(deepcopies) - n
out["said"] = [s for s in said if "turingbox" in s]
if mode != "unpatched":
    try:
        out["pickles_by_reference"] = pickle.loads(pickle.dumps(tokenizers_hf.maybe_make_thread_pool)) is \
            tokenizers_hf.maybe_make_thread_pool
    except Exception as exc:                        # vLLM's function pickles by name; the patch must too
        out["pickles_by_reference"] = f"{type(exc).__name__}: {exc}"
    import vllm.renderers.hf as renderers_hf
    out["renderer_uses_patched"] = renderers_hf.maybe_make_thread_pool is tokenizers_hf.maybe_make_thread_pool
print(json.dumps(out))
