"""`turingbox plan` end to end, in a subprocess: JSON, the table, and bad input (exit 2, one line)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.turingbox.plan.test_planner import fixture, uuids, write_model


def run_plan(*argv, env=None, timeout=120):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")
                and k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "turingbox", "plan", *argv], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


@pytest.fixture(scope="module")
def awq_dir(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("m"), "qwen3.6-27b-awq", awq=True)


def test_plan_json_seed_machine(awq_dir):
    r = run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", awq_dir, "--max-model-len", "262144", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["tensor_parallel_size"] == 4 and plan["num_speculative_tokens"] == 4
    assert plan["model"] == os.path.abspath(awq_dir) and plan["quantization"] == "awq"
    assert plan["gpus"] == uuids("4x2080ti-22g")
    assert plan["cache_key"] and plan["cache_inputs"]["software"]["vllm"]
    assert set(plan["env"]) >= {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "TRITON_CACHE_AUTOTUNING"}


def test_env_overrides_and_visibility_reach_the_plan(awq_dir):
    r = run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", awq_dir, "--json",
                 env={"TURINGBOX_MTP": "2", "CUDA_VISIBLE_DEVICES": "1,2"})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["num_speculative_tokens"] == 2 and plan["tensor_parallel_size"] == 2
    assert plan["env"]["CUDA_VISIBLE_DEVICES"] == "1,2"


def test_plan_table_lists_reasons_and_argv(awq_dir):
    r = run_plan("--gpus-json", fixture("3x2080ti-22g"), "--model", awq_dir)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s+tensor_parallel_size\s+2$", r.stdout, re.MULTILINE)
    assert "reasons:" in r.stdout and "excluded GPUs:" in r.stdout and "vllm serve " in r.stdout
    assert "3 does not divide the 4 KV heads" in r.stdout


def _bad(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    for w in words:
        assert w in lines[0], lines[0]


def test_missing_model_dir(tmp_path):
    _bad(run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", str(tmp_path / "nope"), "--json"),
         "does not exist")


def test_corrupt_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": [')
    _bad(run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", str(tmp_path), "--json"), "not valid JSON")


def test_config_without_heads(tmp_path):
    (tmp_path / "config.json").write_text('{"hidden_size": 64}')
    _bad(run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", str(tmp_path)), "num_attention_heads")


@pytest.mark.parametrize("env,words", [
    ({"TURINGBOX_MTP": "lots"}, ["TURINGBOX_MTP"]),
    ({"TURINGBOX_TP": "3"}, ["--tensor-parallel-size/TURINGBOX_TP 3", "KV heads"]),
    ({"TURINGBOX_GPU_MEMORY_UTILIZATION": "2"}, ["TURINGBOX_GPU_MEMORY_UTILIZATION"]),
    ({"TURINGBOX_DTYPE": "bfloat16"}, ["bfloat16", "sm_75"]),
    ({"CUDA_VISIBLE_DEVICES": "7"}, ["CUDA_VISIBLE_DEVICES", "GPU 7"]),
])
def test_bad_env(awq_dir, env, words):
    _bad(run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", awq_dir, "--json", env=env), *words)


def test_model_does_not_fit(awq_dir):
    _bad(run_plan("--gpus-json", fixture("1x2080ti-11g"), "--model", awq_dir), "does not fit", "GiB")


def test_bad_gpus_json(tmp_path, awq_dir):
    f = tmp_path / "gpus.json"
    f.write_text("[{]")
    _bad(run_plan("--gpus-json", str(f), "--model", awq_dir), "--gpus-json", "not valid JSON")


def test_no_gpu(awq_dir):
    _bad(run_plan("--gpus-json", fixture("empty"), "--model", awq_dir), "no GPU")


def test_demo_model_when_no_model_is_configured(tmp_path_factory):
    models_dir = tmp_path_factory.mktemp("models")
    r = run_plan("--gpus-json", fixture("1xh200"), "--json", env={"TURINGBOX_MODELS_DIR": str(models_dir)})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["demo"] and plan["quantization"] is None and plan["dtype"] == "bfloat16"
    assert plan["model"].startswith(str(models_dir)) and plan["demo_fallback"] is None
    # `turingbox plan` reports; it writes no demo directory (serve and demo-model build it).
    assert not os.path.exists(plan["model"]) and os.listdir(models_dir) == []
    assert "--load-format" in plan["vllm_args"] and plan["reasons"][0].startswith("model: the built-in demo")
    # On Turing the seed's AWQ demo is chosen (it fits 4 cards with far more KV cache than bf16).
    r = run_plan("--gpus-json", fixture("4x2080ti-22g"), "--json", env={"TURINGBOX_MODELS_DIR": str(models_dir)})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["demo"] and plan["quantization"] == "awq" and plan["model"].endswith("-awq")


def test_demo_fallback_is_named_first(tmp_path):
    r = run_plan("--gpus-json", fixture("2x2080ti-11g"), "--json", env={"TURINGBOX_MODELS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    fb = plan["demo_fallback"]
    assert fb["wanted"] == "AWQ INT4, 64 layers" and fb["used"] != fb["wanted"] and "does not fit" in fb["why"]
    assert plan["reasons"][0].startswith("demo fallback: the AWQ INT4, 64 layers demo does not fit")
    assert plan["reasons"][1].startswith("model: the built-in demo")
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def empty_gpus(tmp_path_factory):
    f = tmp_path_factory.mktemp("g") / "gpus.json"
    f.write_text('{"gpus": []}')
    return str(f)


# The refusals, as a new user meets them: exit 2, one sentence naming the setting and numbers.
@pytest.mark.parametrize("inventory,env,words", [
    ("4x2080ti-22g", {"TURINGBOX_GPU_MEMORY_UTILIZATION": "0.1"},
     ["--gpu-memory-utilization/TURINGBOX_GPU_MEMORY_UTILIZATION 0.1", "demo (AWQ INT4, 64 layers)",
      "2.20 GiB per GPU"]),
    ("4x2080ti-22g", {"TURINGBOX_MAX_NUM_SEQS": "10000"},
     ["--max-num-seqs/TURINGBOX_MAX_NUM_SEQS 10000", "demo (AWQ INT4, 64 layers)", "50000 tokens"]),
    ("mixed-3x2080ti-3060", {"TURINGBOX_TP": "4"},
     ["--tensor-parallel-size/TURINGBOX_TP 4", "3x NVIDIA GeForce RTX 2080 Ti", "1x NVIDIA GeForce RTX 3060"]),
    ("4x2080ti-22g", {"TURINGBOX_MAX_MODEL_LEN": "1"}, ["--max-model-len/TURINGBOX_MAX_MODEL_LEN 1", "260 tokens"]),
])
def test_demo_refusals_name_the_setting(tmp_path, inventory, env, words):
    _bad(run_plan("--gpus-json", fixture(inventory), "--json", env=dict(env, TURINGBOX_MODELS_DIR=str(tmp_path))),
         *words)
    assert os.listdir(tmp_path) == []


def test_empty_gpus_object(empty_gpus, awq_dir):
    _bad(run_plan("--gpus-json", empty_gpus, "--model", awq_dir), "--gpus-json/TURINGBOX_GPUS_JSON", empty_gpus,
         "lists no GPU")


def test_model_path_that_is_a_file(awq_dir):
    path = os.path.join(awq_dir, "config.json")
    _bad(run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", path),
         f"--model/TURINGBOX_MODEL {path} is a file", f"(here {awq_dir})")


def test_objective_reaches_the_plan(awq_dir):
    r = run_plan("--gpus-json", fixture("4x2080ti-22g"), "--model", awq_dir, "--json",
                 env={"TURINGBOX_OBJECTIVE": "throughput", "TURINGBOX_STRICT_WARMUP": "0"})
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert (plan["tensor_parallel_size"], plan["data_parallel_size"], plan["objective"]) == (2, 2, "throughput")


def test_min_model_len_above_the_models_context_is_refused(tmp_path, awq_dir):
    for model in ([], ["--model", awq_dir]):          # the demo model and a configured one
        r = run_plan("--gpus-json", fixture("1xh200"), *model, "--json",
                     env={"TURINGBOX_MIN_MODEL_LEN": "300000", "TURINGBOX_MODELS_DIR": str(tmp_path)})
        _bad(r, "--min-model-len/TURINGBOX_MIN_MODEL_LEN 300000 exceeds the model's 262144-token context "
                "(max_position_embeddings)")


def test_a_mistyped_setting_is_refused_before_planning(tmp_path):
    r = run_plan("--gpus-json", fixture("1xh200"), env={"TURINGBOX_MAX_MODEL_LENGTH": "32768",
                                                        "TURINGBOX_MODELS_DIR": str(tmp_path)})
    _bad(r, "TURINGBOX_MAX_MODEL_LENGTH is not a setting; did you mean TURINGBOX_MAX_MODEL_LEN?")


def test_demo_table_and_argv_carry_both_served_names(tmp_path):
    r = run_plan("--gpus-json", fixture("1xh200"), env={"TURINGBOX_MODELS_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\s+served as\s+turingbox-demo-qwen3\.6-27b, demo$", r.stdout, re.MULTILINE), r.stdout
    assert " --served-model-name turingbox-demo-qwen3.6-27b demo --" in r.stdout
