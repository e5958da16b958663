"""Plan settings: declared once (flag + TURINGBOX_* variable), validated, flag beats env beats default."""
from __future__ import annotations

import argparse

import pytest

from turingbox import config as S
from turingbox.errors import UsageError

PLAN_SETTINGS = S.PLAN_SETTINGS


def parse(argv, env=None):
    """The plan and demo settings `turingbox plan` loads from these flags and variables, by name."""
    parser = argparse.ArgumentParser()
    S.add_arguments(parser, PLAN_SETTINGS)
    loaded = S.load(parser.parse_args(argv), env or {}, groups=("plan", "demo"))
    return {name: getattr(group, name) for group in (loaded.plan, loaded.demo) for name in group.setting_names()}


def test_every_plan_setting_is_declared_with_flag_and_env():
    for name in PLAN_SETTINGS:
        s = S.REGISTRY[name]
        assert s.flag_name.startswith("--") and s.env_name.startswith("TURINGBOX_") and s.help


def test_defaults_mean_automatic():
    v = parse([])
    for name in ("tensor_parallel_size", "mtp", "max_model_len", "max_num_seqs", "gpu_memory_utilization",
                 "kv_cache_dtype", "attention_backend", "dtype", "model", "gpus_json"):
        assert v[name] is None, name
    assert v["prefix_caching"] is True and v["enforce_eager"] is False and v["min_model_len"] == 4096


@pytest.mark.parametrize("env,name,expected", [
    ({"TURINGBOX_TP": "4"}, "tensor_parallel_size", 4),
    ({"TURINGBOX_MTP": "0"}, "mtp", 0),
    ({"TURINGBOX_MTP": "8"}, "mtp", 8),
    ({"TURINGBOX_MAX_MODEL_LEN": "256k"}, "max_model_len", 262144),
    ({"TURINGBOX_MAX_MODEL_LEN": "32768"}, "max_model_len", 32768),
    ({"TURINGBOX_ATTENTION_BACKEND": "flashinfer"}, "attention_backend", "FLASHINFER"),
    ({"TURINGBOX_DTYPE": "auto"}, "dtype", None),
    ({"TURINGBOX_DTYPE": "float16"}, "dtype", "half"),
    ({"TURINGBOX_KV_CACHE_DTYPE": "fp8_e5m2"}, "kv_cache_dtype", "fp8_e5m2"),
    ({"TURINGBOX_PREFIX_CACHING": "off"}, "prefix_caching", False),
    ({"TURINGBOX_GPU_MEMORY_UTILIZATION": "0.85"}, "gpu_memory_utilization", 0.85),
    ({"TURINGBOX_GDN": "vllm"}, "gdn", "vllm"),
])
def test_env_values(env, name, expected):
    assert parse([], env)[name] == expected


@pytest.mark.parametrize("env,words", [
    ({"TURINGBOX_MTP": "9"}, ["TURINGBOX_MTP", "'9'", "between 0 and 8"]),
    ({"TURINGBOX_MTP": "-1"}, ["TURINGBOX_MTP"]),
    ({"TURINGBOX_MTP": "three"}, ["TURINGBOX_MTP", "whole number"]),
    ({"TURINGBOX_TP": "0"}, ["TURINGBOX_TP"]),
    ({"TURINGBOX_MAX_MODEL_LEN": "lots"}, ["TURINGBOX_MAX_MODEL_LEN"]),
    ({"TURINGBOX_GPU_MEMORY_UTILIZATION": "1.5"}, ["TURINGBOX_GPU_MEMORY_UTILIZATION", "between 0 and 1"]),
    ({"TURINGBOX_ATTENTION_BACKEND": "xformers"}, ["TURINGBOX_ATTENTION_BACKEND", "flashinfer"]),
    ({"TURINGBOX_KV_CACHE_DTYPE": "int4"}, ["TURINGBOX_KV_CACHE_DTYPE"]),
    ({"TURINGBOX_ENFORCE_EAGER": "maybe"}, ["TURINGBOX_ENFORCE_EAGER"]),
])
def test_bad_env_values_name_the_setting(env, words):
    with pytest.raises(UsageError) as info:
        parse([], env)
    text = str(info.value)
    assert "\n" not in text
    for w in words:
        assert w in text


def test_flag_beats_env():
    v = parse(["--mtp", "2", "--tensor-parallel-size", "2"], {"TURINGBOX_MTP": "4", "TURINGBOX_TP": "4"})
    assert (v["mtp"], v["tensor_parallel_size"]) == (2, 2)


def test_bad_flag_names_the_flag():
    with pytest.raises(UsageError, match="--max-num-seqs"):
        parse(["--max-num-seqs", "0"])


def test_one_table_in_order_and_complete_without_feature_imports():
    """REGISTRY is the table (no module has to be imported first); each command's names are its groups."""
    assert list(S.REGISTRY) == [s.name for s in S.SETTINGS]
    groups = S.PLAN_SETTINGS + S.SERVE_SETTINGS + S.CACHE_SETTINGS + S.WARMUP_SETTINGS
    assert sorted(groups) == sorted(S.REGISTRY)
    assert S.PLAN_SETTINGS == S.PLANNER_SETTINGS + S.DEMO_SETTINGS


def test_defaults_are_written_once():
    """Each typed group's defaults are the table's, in the table's names (ServeOptions is ServeSettings), and the
    machine-dependent ones are computed when the settings are made, not when the table is imported."""
    from turingbox.serve.options import ServeOptions
    assert ServeOptions is S.ServeSettings
    for group, (cls, names) in S.GROUPS.items():
        assert cls.setting_names() == names, group
        made = cls()
        assert {n: getattr(made, n) for n in names} == {n: S.REGISTRY[n].default_value() for n in names}, group
    for name in ("cache_dir", "models_dir", "runtime_dir"):
        assert S.REGISTRY[name].default is None and S.REGISTRY[name].default_factory is not None


def test_machine_dependent_defaults_follow_the_environment_of_the_load(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)          # gettempdir() reads TMPDIR again
    loaded = S.load(None, {}, groups=("plan", "demo", "cache"))
    assert loaded.cache.cache_dir == str(tmp_path / ".cache" / "turingbox")
    assert loaded.demo.models_dir == str(tmp_path / ".cache" / "turingbox" / "models")
    assert loaded.plan.runtime_dir == str(tmp_path / "tmp" / "turingbox-runtime")


def test_vocabulary_lives_below_the_planner():
    from turingbox.plan import arch
    assert (arch.MTP_MAX, arch.BACKENDS, arch.KV_DTYPES) == (S.MTP_MAX, S.BACKENDS, S.KV_DTYPES)


def test_given_and_empty_variables():
    args = argparse.Namespace(demo_awq="1")
    demo = S.load_group("demo", args, {})
    assert "demo_awq" in demo.given and "demo_layers" not in demo.given and demo.variant_given
    assert "demo_layers" in S.load_group("demo", None, {"TURINGBOX_DEMO_LAYERS": "8"}).given
    unset = S.load_group("demo", None, {"TURINGBOX_DEMO_LAYERS": ""})
    assert not unset.variant_given and unset.empty_variables == {"demo_layers"}
    assert [("api_key" in S.load_group("serve", None, e).given, "api_key" in S.load_group("serve", None, e).empty_variables)
            for e in ({"TURINGBOX_API_KEY": "k"}, {"TURINGBOX_API_KEY": ""}, {})] \
        == [(True, False), (False, True), (False, False)]
    assert S.given_value("runtime_dir", None, {"TURINGBOX_RUNTIME_DIR": "/r"}) == "/r"
    assert S.given_value("runtime_dir", None, {}) is None
