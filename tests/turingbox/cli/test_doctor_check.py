"""The appliance adds its plan line to the plugin's doctor through an entry point (the plugin imports
nothing of the appliance): installed together, `turingbox doctor` plans for the machine as `turingbox plan`
does — MODEL, else TURINGBOX_MODEL, else the built-in demo — on NVML or --gpus-json / TURINGBOX_GPUS_JSON.
Real `python -m turingbox` subprocesses."""
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
FIXTURES = os.path.join(REPO, "tests", "fixtures", "gpus")
H200 = os.path.join(FIXTURES, "1xh200.json")
NO_GPU = not os.path.exists("/dev/nvidiactl")


def clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")}
    return {**env, **extra}


def turingbox(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "turingbox", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def plan_line(r: subprocess.CompletedProcess) -> dict:
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    return {c["name"]: c for c in json.loads(r.stdout)["checks"]}["plan"]


def test_the_appliance_registers_its_plan_check():
    eps = {ep.name: ep.value for ep in entry_points(group="turingbox_plugin.doctor_checks")}
    assert eps.get("plan") == "turingbox.cli.doctor_check:check_plan"


def test_doctor_plans_the_demo_by_default_from_turingbox_gpus_json():
    env = clean_env(TURINGBOX_GPUS_JSON=H200)
    line = plan_line(turingbox("doctor", "--json", env=env))
    plan = json.loads(turingbox("plan", "--json", env=env).stdout)
    assert line["status"] == "PASS", line
    assert "no MODEL given" not in line["detail"] and "built-in demo" in line["detail"]
    # the very plan `turingbox plan` makes from the same inventory and settings
    assert plan["demo"] and f"1x {plan['gpu_name']}" in line["detail"]
    assert (f"TP {plan['tensor_parallel_size']}, MTP {plan['num_speculative_tokens']}, KV {plan['kv_cache_dtype']}"
            in line["detail"]) and f"max_model_len {plan['max_model_len']}" in line["detail"]


def test_doctor_takes_gpus_json_as_a_flag():
    assert "--gpus-json" in turingbox("doctor", "--help", env=clean_env()).stdout
    r = turingbox("doctor", "--json", "--gpus-json", H200, env=clean_env())
    line = plan_line(r)
    assert line["status"] == "PASS" and "NVIDIA H200" in line["detail"], line
    # the flag wins over the variable, as for every setting
    v100 = os.path.join(FIXTURES, "1xv100.json")
    line = plan_line(turingbox("doctor", "--json", "--gpus-json", H200, env=clean_env(TURINGBOX_GPUS_JSON=v100)))
    assert line["status"] == "PASS" and "NVIDIA H200" in line["detail"], line


@pytest.mark.skipif(not NO_GPU, reason="this test describes a GPU-less machine")
def test_doctor_without_gpus_says_how_to_simulate_them():
    line = plan_line(turingbox("doctor", "--json", env=clean_env()))
    assert line["status"] == "FAIL" and "no MODEL given" not in line["detail"]
    assert "--gpus-json FILE" in line["detail"] and "\n" not in line["detail"]


def test_doctor_plan_line_for_a_bad_model_dir_is_one_sentence(tmp_path):
    r = turingbox("doctor", "--json", str(tmp_path), env=clean_env(TURINGBOX_GPUS_JSON=H200))
    line = plan_line(r)
    # an empty model directory: the plan line is one sentence naming it, never a traceback
    assert line["status"] == "FAIL" and str(tmp_path) in line["detail"] and "\n" not in line["detail"]
    assert r.returncode == 1


def test_doctor_plan_line_for_a_missing_gpus_json_names_it(tmp_path):
    missing = str(tmp_path / "gpus.json")
    line = plan_line(turingbox("doctor", "--json", env=clean_env(TURINGBOX_GPUS_JSON=missing)))
    assert line["status"] == "FAIL" and missing in line["detail"] and "does not exist" in line["detail"]
