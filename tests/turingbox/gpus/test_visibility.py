"""NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES in every form, applied on top of an inventory."""
from __future__ import annotations

from pathlib import Path

import pytest

from turingbox.errors import PlanError, UsageError
from turingbox.gpus.inventory import JsonSource, read_inventory
from turingbox.gpus.visibility import apply_visibility, cuda_visible_devices, parse_tokens

FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "gpus"
GPUS = JsonSource(str(FIXTURES / "4x2080ti-22g.json")).list_gpus()
U = [g.uuid for g in GPUS]


def visible(env):
    return [g.index for g in apply_visibility(GPUS, env)[0]]


@pytest.mark.parametrize("env,expected", [
    ({}, [0, 1, 2, 3]),
    ({"CUDA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
    ({"CUDA_VISIBLE_DEVICES": "2"}, [2]),
    ({"CUDA_VISIBLE_DEVICES": " 3, 1 "}, [1, 3]),                    # CUDA order is PCI order
    ({"CUDA_VISIBLE_DEVICES": U[2]}, [2]),                           # full UUID
    ({"CUDA_VISIBLE_DEVICES": U[3][:12]}, [3]),                      # short UUID (unique prefix)
    ({"CUDA_VISIBLE_DEVICES": U[1].upper().replace("GPU-", "GPU-")}, [1]),
    ({"CUDA_VISIBLE_DEVICES": ""}, []),                              # set but empty hides every GPU
    ({"CUDA_VISIBLE_DEVICES": "-1"}, []),
    ({"CUDA_VISIBLE_DEVICES": "none"}, []),
    ({"NVIDIA_VISIBLE_DEVICES": "void"}, []),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, [0, 1, 2, 3]),
    ({"NVIDIA_VISIBLE_DEVICES": ""}, [0, 1, 2, 3]),                  # unset for us: not a runtime filter
    ({"NVIDIA_VISIBLE_DEVICES": "1,2"}, [1, 2]),                     # host indices
    ({"NVIDIA_VISIBLE_DEVICES": f"{U[0]},{U[3]}"}, [0, 3]),
    # The runtime applies NVIDIA first; CUDA indices are then positions among what is left.
    ({"NVIDIA_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "0"}, [1]),
    ({"NVIDIA_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, [3]),
])
def test_visibility_forms(env, expected):
    assert visible(env) == expected


def test_nvidia_variable_already_applied_inside_a_container():
    # In a container given host GPUs 5,6 the runtime renumbers them 0,1: indices no longer match.
    two = GPUS[:2]
    kept, hidden, note = apply_visibility(two, {"NVIDIA_VISIBLE_DEVICES": "5,6"})
    assert [g.index for g in kept] == [0, 1] and hidden == [] and "already applied" in note


@pytest.mark.parametrize("env,error,words", [
    ({"CUDA_VISIBLE_DEVICES": "4"}, UsageError, ["GPU 4", "0-3"]),
    ({"CUDA_VISIBLE_DEVICES": "1,1"}, UsageError, ["twice"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-ffffffff"}, UsageError, ["matches none"]),
    ({"CUDA_VISIBLE_DEVICES": "GPU-"}, UsageError, ["matches 4 GPUs"]),
    ({"CUDA_VISIBLE_DEVICES": "1,,2"}, UsageError, ["empty entry"]),
    ({"CUDA_VISIBLE_DEVICES": "gpu0"}, UsageError, ["neither"]),
    ({"NVIDIA_VISIBLE_DEVICES": "7"}, UsageError, ["index 7"]),
    ({"CUDA_VISIBLE_DEVICES": "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0"}, PlanError, ["MIG"]),
    ({"CUDA_VISIBLE_DEVICES": "MIG-5c89852c-d268-c3f3-1b07-005d5ae1dc3f"}, PlanError, ["MIG", "whole GPUs"]),
    ({"NVIDIA_VISIBLE_DEVICES": "0:1"}, PlanError, ["MIG device 0:1"]),
])
def test_bad_visibility_is_one_sentence(env, error, words):
    with pytest.raises(error) as info:
        apply_visibility(GPUS, env)
    text = str(info.value)
    assert "\n" not in text
    for w in words:
        assert w in text


def test_hidden_gpus_are_reported_with_the_variable():
    kept, hidden, note = apply_visibility(GPUS, {"NVIDIA_VISIBLE_DEVICES": "0,1,2", "CUDA_VISIBLE_DEVICES": "2"})
    assert [g.index for g in kept] == [2]
    assert {h["index"]: h["reason"] for h in hidden} == {
        3: "not in NVIDIA_VISIBLE_DEVICES", 0: "not in CUDA_VISIBLE_DEVICES", 1: "not in CUDA_VISIBLE_DEVICES"}
    assert "NVIDIA_VISIBLE_DEVICES=0,1,2" in note and "CUDA_VISIBLE_DEVICES=2" in note


def test_read_inventory_applies_visibility_to_json():
    inv = read_inventory(str(FIXTURES / "4x2080ti-22g.json"), {"CUDA_VISIBLE_DEVICES": "3,0"})
    assert [g.index for g in inv.gpus] == [0, 3] and len(inv.all_gpus) == 4 and len(inv.hidden) == 2


def test_vllm_gets_nvml_indices_in_pci_order():
    # vLLM 0.21 does int(CUDA_VISIBLE_DEVICES[i]) to find the NVML handle: indices, never UUIDs.
    assert cuda_visible_devices([GPUS[3], GPUS[1]]) == "1,3"


def test_parse_tokens_all_and_none():
    assert parse_tokens("X", "ALL") is None
    assert parse_tokens("X", "void") == [] and parse_tokens("X", "None") == []
    assert parse_tokens("X", "0, GPU-abc") == ["0", "GPU-abc"]
