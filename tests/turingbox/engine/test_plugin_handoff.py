"""The plugin's settings come from the appliance's, resolved once: every key the engine launcher hands the
plugin in --additional-config '{"turingbox": {...}}' (and every variable of the plan's env the plugin reads) is a
field of the plugin's PluginSettings and is listed in turingbox.config (PLUGIN_CONFIG / PLUGIN_ENV) with the
declared setting(s) it comes from; changing such a setting changes what the plugin gets."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from turingbox import config as S
from turingbox.engine.launch import flag_value, vllm_argv
from tests.support.plan_factory import plan_from_env
from turingbox_plugin.activation import CONFIG_KEY, PluginSettings, resolve_settings

REPO = Path(__file__).resolve().parents[3]
H200 = str(REPO / "tests" / "fixtures" / "gpus" / "1xh200.json")
FIELDS = {f.name for f in dataclasses.fields(PluginSettings)}


def _get(plan, key):
    return plan[key] if isinstance(plan, dict) else getattr(plan, key)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.turingbox.plan.test_planner import write_model
    return write_model(tmp_path_factory.mktemp("models"), "Qwen3.6-27B")


def handed(model_dir: str, **env: str) -> tuple[dict, dict]:
    """(the plugin's section of the launched argv's --additional-config, the plan's env) for these settings."""
    plan = plan_from_env({"TURINGBOX_GPUS_JSON": H200, "TURINGBOX_MODEL": model_dir, **env})
    argv = vllm_argv(_get(plan, "vllm_args"), 8001, [], None)      # what the launcher starts vLLM with
    return json.loads(flag_value(argv, "--additional-config"))[CONFIG_KEY], dict(_get(plan, "env") or {})


def test_plugin_config_table_names_declared_settings_and_plugin_fields():
    """Every key of the contract's PluginConfig is in PLUGIN_CONFIG, with the settings it comes from (none:
    the contract's default); PLUGIN_ENV is the contract's ENGINE_ENV, whose variables are the plugin's own
    (TBPLUGIN_*), never the variable of the setting they carry."""
    from turingbox_plugin.contract import ENGINE_ENV, PluginConfig
    assert set(S.PLUGIN_CONFIG) == {f.name for f in dataclasses.fields(PluginConfig)}
    assert set(S.PLUGIN_ENV.values()) <= FIELDS and S.PLUGIN_ENV == ENGINE_ENV
    for key, names in S.PLUGIN_CONFIG.items():
        assert set(names) <= set(S.REGISTRY), key
    for var, name in S.PLUGIN_ENV.items():
        assert name in S.REGISTRY and var.startswith("TBPLUGIN_") and S.REGISTRY[name].env_name != var


def test_launched_additional_config_keys_are_plugin_fields_from_settings(model_dir):
    section, env = handed(model_dir)
    assert set(section) <= FIELDS, set(section) - FIELDS
    assert set(section) == set(S.PLUGIN_CONFIG), "a plugin key without its declared setting (or one never sent)"
    assert set(S.PLUGIN_ENV) <= set(env)
    # the plugin's own resolver reads exactly these values, nothing left over
    resolved = resolve_settings({CONFIG_KEY: section}, {k: v for k, v in env.items() if k in S.PLUGIN_ENV})
    assert resolved.active and resolved.extra == {}
    assert resolved.runtime_dir == env[plugin_var("runtime_dir")]
    assert not {k for k in env if k.startswith("TURINGBOX_")}, "the plan hands the plugin no TURINGBOX_* name"


@pytest.mark.parametrize("var, value, key, expected", [
    ("TURINGBOX_STRICT_WARMUP", "0", "strict_warmup", False),
    ("TURINGBOX_STRICT_WARMUP", "1", "strict_warmup", True),
    ("TURINGBOX_REQUIRE_PLUGIN", "0", "require_plugin", False),
    ("TURINGBOX_GDN", "turbo", "gdn", "turbo"),
    ("TURINGBOX_GDN", "vllm", "gdn", "vllm"),
    ("TURINGBOX_MTP", "0", "num_speculative_tokens", 0),
    ("TURINGBOX_MAX_NUM_SEQS", "3", "max_num_seqs", 3),
])
def test_each_plugin_key_follows_its_resolved_setting(model_dir, var, value, key, expected):
    section, _ = handed(model_dir, **{var: value})
    assert section[key] == expected
    name = next(n for n, s in S.REGISTRY.items() if s.env_name == var)
    assert name in S.PLUGIN_CONFIG[key]


def test_enforce_eager_empties_the_capture_sizes(model_dir):
    assert handed(model_dir)[0]["cudagraph_capture_sizes"]
    assert handed(model_dir, TURINGBOX_ENFORCE_EAGER="1")[0]["cudagraph_capture_sizes"] == []


def plugin_var(name: str) -> str:
    """The contract's variable (TBPLUGIN_*) that carries this setting's resolved value."""
    return next(var for var, setting in S.PLUGIN_ENV.items() if setting == name)


@pytest.mark.parametrize("name, value, expected", [("benchmark_mode", "1", "1"), ("benchmark_mode", "0", "0")])
def test_plugin_env_follows_its_resolved_setting(model_dir, name, value, expected):
    _, env = handed(model_dir, **{S.REGISTRY[name].env_name: value})
    assert env[plugin_var(name)] == expected


def test_runtime_dir_is_resolved_before_it_is_handed(model_dir, tmp_path):
    _, env = handed(model_dir, **{S.REGISTRY["runtime_dir"].env_name: str(tmp_path / "rt")})
    assert env[plugin_var("runtime_dir")] == str(tmp_path / "rt")


def test_unset_keys_are_the_contracts_defaults(model_dir):
    from turingbox_plugin.contract import PluginConfig
    section, _ = handed(model_dir)
    for key in (k for k, names in S.PLUGIN_CONFIG.items() if not names):
        assert section[key] == getattr(PluginConfig(), key), key


def test_the_autotune_compile_threads_travel_in_the_engines_environment_not_in_vllms_cache_key(model_dir):
    """A CPU count changes no kernel: in --additional-config (which vLLM hashes into its compile-cache key) it would
    split the cache between machines; it travels as the contract's engine variable, unset by default."""
    from turingbox_plugin.contract import AUTOTUNE_THREADS_ENV
    section, env = handed(model_dir)
    assert "autotune_compile_threads" not in section and env[AUTOTUNE_THREADS_ENV] is None   # None: unset
    section3, env3 = handed(model_dir, TURINGBOX_AUTOTUNE_COMPILE_THREADS="3")
    assert section3 == section and env3[AUTOTUNE_THREADS_ENV] == "3"
    assert resolve_settings({CONFIG_KEY: section3}, {AUTOTUNE_THREADS_ENV: "3"}).autotune_compile_threads == 3
