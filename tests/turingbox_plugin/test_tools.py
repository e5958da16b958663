"""doctor, verify --compile-only, check-model: real subprocesses of the `turingbox-plugin` script."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from turingbox_plugin.verify import parse_arch, parse_ptxas_resources

CLI = [sys.executable, "-m", "turingbox_plugin.cli"]
NO_GPU = not os.path.exists("/dev/nvidiactl")


def load_config(d) -> dict:
    return json.loads((d / "config.json").read_text())


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.skipif(not NO_GPU, reason="this test describes a GPU-less machine")
def test_doctor_on_gpu_less_machine_fails_cleanly(real_model_dir):
    r = run("doctor", str(real_model_dir))
    assert r.returncode == 1
    assert "Traceback" not in r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert all(line.split()[0] in ("PASS", "WARN", "FAIL") for line in lines)
    by_name = {line.split(None, 1)[1].split(":")[0]: line.split()[0] for line in lines}
    assert by_name["gpus"] == "FAIL"
    assert by_name["python"] == "PASS" and by_name["plugin entry point"] == "PASS"
    assert by_name["model"] == "PASS"
    assert by_name["ptxas"] == "PASS"
    if importlib.util.find_spec("vllm") is None:
        assert by_name["vllm"] == "FAIL"
    j = run("doctor", "--json")
    data = json.loads(j.stdout)
    assert j.returncode == 1 and data["ok"] is False
    # "plan" comes from the appliance (an entry point of its own), when it is installed beside the plugin
    from importlib.metadata import entry_points
    extra = {ep.name for ep in entry_points(group="turingbox_plugin.doctor_checks")}
    assert {c["name"] for c in data["checks"]} >= {"python", "torch", "cuda", "triton", "ptxas", "vllm", "gpus",
                                                   "plugin entry point", "gdn interface"} | extra


def test_doctor_bad_model_is_one_fail_line(tmp_path):
    r = run("doctor", str(tmp_path / "nope"))
    assert "Traceback" not in r.stderr
    assert any(l.startswith("FAIL  model:") and "does not exist" in l for l in r.stdout.splitlines())


def test_gdn_interface_check_reads_source_without_importing(tmp_path):
    from turingbox_plugin.doctor import GDN_INTERFACE, check_gdn_interface

    for rel, symbol in GDN_INTERFACE:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(f"{symbol}(x):\n    raise SystemExit('imported!')\n")
    assert check_gdn_interface(str(tmp_path)).status == "PASS"
    (tmp_path / GDN_INTERFACE[0][0]).write_text("def something_else(): pass\n")
    c = check_gdn_interface(str(tmp_path))
    assert c.status == "FAIL" and "chunk_gated_delta_rule" in c.detail


def test_verify_compile_only_for_sm75_without_gpu():
    r = run("verify", "--compile-only", "--arch", "7.5", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["ok"] and data["kernels"]
    for k in data["kernels"]:
        assert k["arch"] == "7.5" if "arch" in k else True
        assert k["ok"] and k["shared_bytes"] <= 65536, k
        if not k["name"].startswith("flashinfer:"):
            # our kernels never spill; FlashInfer's head_dim-256 prefill does (~100 B at 255 registers), and
            # its prebuilt modules' rows carry what cuobjdump reports: both are listed, not held to this
            assert k["registers"] > 0 and k["spills"] == 0, k


def test_verify_bad_arch_is_one_sentence():
    r = run("verify", "--compile-only", "--arch", "turing")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "--arch" in r.stderr


def test_arch_and_ptxas_parsing():
    assert parse_arch("7.5") == parse_arch("75") == parse_arch("sm_75") == 75
    assert parse_arch("9.0") == 90 and parse_arch("12.0") == 120
    log = ("ptxas info    : Function properties for chunk_fwd_kernel_o\n"
           "    8 bytes stack frame, 24 bytes spill stores, 16 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 424 bytes cmem[0]\n")
    assert parse_ptxas_resources(log) == {"registers": 255, "spill_stores": 24, "spill_loads": 16,
                                          "stack_bytes": 8, "spills": 40}


def test_check_model_real_architecture(real_model_dir):
    r = run("check-model", str(real_model_dir), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["architecture"] == "Qwen3_5ForConditionalGeneration" and d["supported_architecture"]
    assert (d["layers"], d["full_attention_layers"], d["gdn_layers"], d["mtp_layers"]) == (64, 16, 48, 1)
    assert d["tensor_parallel"] == {"1": "ok", "2": "ok", "4": "ok", "8": "ok"}
    text = run("check-model", str(real_model_dir))
    assert "MTP head: 1 layer(s)" in text.stdout and "TP8: ok" in text.stdout


def test_check_model_flags_illegal_tp_and_awq_trap(real_model_dir):
    cfg = load_config(real_model_dir)
    cfg["text_config"]["linear_num_value_heads"] = 36          # 36 % 8 != 0
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128,
                                  "modules_to_not_convert": ["visual", "mtp"]}
    (real_model_dir / "config.json").write_text(json.dumps(cfg))
    d = json.loads(run("check-model", str(real_model_dir), "--json").stdout)
    assert d["tensor_parallel"]["8"] == "linear_num_value_heads 36 is not divisible by TP 8"
    assert d["tensor_parallel"]["4"] == "ok"
    assert d["quantization"]["method"] == "awq"
    assert any("in_proj_ba" in n for n in d["notes"])


def test_check_model_missing_dir_exit_2(tmp_path):
    r = run("check-model", str(tmp_path / "missing"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
