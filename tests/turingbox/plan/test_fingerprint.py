"""Same inputs -> same key; every kernel-relevant input changes it; context length does not."""
import json
import os

import pytest

from turingbox.cache import store
from turingbox.plan import fingerprint
from tests.support.cache_helpers import PLAN, SOFTWARE, make_plan
from tests.support.plan_factory import cache_settings


def test_same_inputs_give_the_same_key_across_dict_order():
    a = make_plan()
    reordered = dict(reversed(list(PLAN.items())))
    b = make_plan(**reordered)
    assert a["cache_key"] == b["cache_key"]
    assert len(a["cache_key"]) == 16
    # and the key is a pure function of the JSON that is stored in the manifest
    assert fingerprint.cache_key(json.loads(json.dumps(a["cache_inputs"]))) == a["cache_key"]


CHANGES = {
    "tensor_parallel_size": 2, "num_speculative_tokens": 4, "dtype": "bfloat16", "kv_cache_dtype": "auto",
    "attention_backend": "TRITON_ATTN", "gdn_prefill_backend": "flashinfer", "gdn_path": "vllm",
    "quantization": None, "max_num_seqs": 32, "max_num_batched_tokens": 8192,
    "cudagraph_capture_sizes": [1, 2, 4, 8], "enforce_eager": True,
}


def test_every_kernel_relevant_plan_field_is_covered():
    assert set(CHANGES) == set(fingerprint.KERNEL_PLAN_FIELDS)


@pytest.mark.parametrize("field,value", sorted(CHANGES.items()))
def test_each_kernel_relevant_field_changes_the_key(field, value):
    assert make_plan(**{field: value})["cache_key"] != make_plan()["cache_key"]


@pytest.mark.parametrize("field,value", [("gpu_name", "NVIDIA H200"), ("compute_capability", "9.0"),
                                         ("model_config_hash", "cfg1")])
def test_hardware_and_model_change_the_key(field, value):
    assert make_plan(**{field: value})["cache_key"] != make_plan()["cache_key"]


@pytest.mark.parametrize("package", sorted(SOFTWARE))
def test_each_software_version_changes_the_key(package):
    assert make_plan(software={**SOFTWARE, package: "9.9.9"})["cache_key"] != make_plan()["cache_key"]


def test_the_key_revision_changes_the_key(monkeypatch):
    before = make_plan()["cache_key"]
    monkeypatch.setattr(fingerprint, "KEY_REVISION", fingerprint.KEY_REVISION + 1)
    assert make_plan()["cache_key"] != before


def test_mtp_depth_3_and_4_get_different_keys_and_entries(tmp_path):
    p3, p4 = make_plan(num_speculative_tokens=3), make_plan(num_speculative_tokens=4)
    assert p3["cache_key"] != p4["cache_key"]
    s3 = store.prepare_cache(p3, cache_settings(str(tmp_path)))
    with open(os.path.join(s3.env["TRITON_CACHE_DIR"], "kernel.cubin"), "wb") as f:   # the engine wrote artefacts
        f.write(b"\x7fELF")
    s3.finish(True)
    s4 = store.prepare_cache(p4, cache_settings(str(tmp_path)))
    assert s4.status["result"] == "miss" and s4.entry != s3.entry
    assert s4.status["nearest"]["differences"] == ["plan.num_speculative_tokens: 3 != 4"]
    assert all(v.startswith(s4.entry) for k, v in s4.env.items() if k in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"))
    s4.finish(True)


@pytest.mark.parametrize("field,value", [("max_model_len", 4096), ("gpu_memory_utilization", 0.5)])
def test_context_length_and_memory_share_one_entry(field, value):
    assert make_plan(**{field: value})["cache_key"] == make_plan()["cache_key"]


def test_differences_name_nested_inputs():
    a, b = make_plan()["cache_inputs"], make_plan(tensor_parallel_size=2, gpu_name="NVIDIA H200")["cache_inputs"]
    assert fingerprint.differences(a, b) == ["gpu_name: 'NVIDIA GeForce RTX 2080 Ti' != 'NVIDIA H200'",
                                             "plan.tensor_parallel_size: 1 != 2"]
