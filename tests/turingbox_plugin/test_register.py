"""Entry-point discovery, register() re-entrancy, inactive no-op, no CUDA in non-worker processes."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata

import pytest

from tests.turingbox_plugin.vllm_source import vllm_source_root  # noqa: E402

from turingbox_plugin.activation import resolve_settings, turingbox_section, argv_additional_config

PROBE = r"""
import json, os, sys
before = dict(os.environ)
sys.argv = json.loads(os.environ.pop("PROBE_ARGV", "[]")) or sys.argv
before.pop("PROBE_ARGV", None)
import turingbox_plugin
turingbox_plugin.register()
first = dict(os.environ)
os.environ["TRITON_CACHE_AUTOTUNING"] = "sentinel"
turingbox_plugin.register()          # re-entrant: a second call must change nothing
second_ok = os.environ["TRITON_CACHE_AUTOTUNING"] == "sentinel"
changed = {k: first.get(k) for k in set(first) | set(before) if first.get(k) != before.get(k)}
cuda_init = None
if "torch" in sys.modules:
    cuda_init = sys.modules["torch"].cuda.is_initialized()
print(json.dumps({"changed": changed, "second_ok": second_ok, "torch_imported": "torch" in sys.modules,
                  "triton_imported": "triton" in sys.modules, "cuda_init": cuda_init}))
"""


def probe(env_extra: dict | None = None, argv: list[str] | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_") and k != "TRITON_CACHE_AUTOTUNING"}
    env.update(env_extra or {})
    if argv:
        env["PROBE_ARGV"] = json.dumps(argv)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_entry_point_is_discoverable():
    eps = [ep for ep in metadata.entry_points(group="vllm.general_plugins") if ep.name == "turingbox"]
    assert len(eps) == 1
    assert eps[0].value == "turingbox_plugin:register"
    assert eps[0].load() is __import__("turingbox_plugin").register


def test_inactive_register_changes_nothing_and_imports_no_torch():
    r = probe()
    assert r["changed"] == {}
    assert r["second_ok"]
    assert not r["torch_imported"] and not r["triton_imported"]


ACTIVE_ARGV = ["vllm", "serve", "m", "--additional-config", json.dumps({"turingbox": {}})]


def test_activation_sets_only_documented_defaults():
    r = probe(argv=ACTIVE_ARGV)
    assert r["changed"] == {"TRITON_CACHE_AUTOTUNING": "1"}
    assert r["second_ok"]
    assert not r["torch_imported"]


def test_user_value_wins_over_default():
    r = probe({"TRITON_CACHE_AUTOTUNING": "0"}, argv=ACTIVE_ARGV)
    assert r["changed"] == {}


def test_the_appliances_variables_alone_do_not_activate_the_plugin():
    """The plugin reads its contract only: TURINGBOX_* settings in vLLM's environment change nothing."""
    r = probe({"TURINGBOX_PLUGIN": "1", "TURINGBOX_STRICT_WARMUP": "1", "TURINGBOX_GDN": "turbo"})
    assert r["changed"] == {}


def test_additional_config_in_argv_activates():
    argv = ["vllm", "serve", "m", "--additional-config", json.dumps({"turingbox": {"strict_warmup": True}})]
    assert probe(argv=argv)["changed"] == {"TRITON_CACHE_AUTOTUNING": "1"}
    other = ["vllm", "serve", "m", "--additional-config", json.dumps({"someone_else": {}})]
    assert probe(argv=other)["changed"] == {}


def test_malformed_section_does_not_raise_in_register():
    argv = ["vllm", "serve", "m", "--additional-config={\"turingbox\": {\"gdn\": \"warp\"}}"]
    assert probe(argv=argv)["changed"] == {}


def test_plugin_modules_never_initialise_cuda():
    code = ("import torch, turingbox_plugin, turingbox_plugin.cli, turingbox_plugin.status, "
            "turingbox_plugin.warmup_plan, turingbox_plugin.jit_accounting, turingbox_plugin.autotune\n"
            "from turingbox_plugin import doctor\n"
            f"sys.argv = {ACTIVE_ARGV!r}\n"
            "turingbox_plugin.register(); doctor.run_checks(None)\n"
            "print(torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_settings_come_from_the_contract_only():
    assert not resolve_settings(None, {}).active
    assert not resolve_settings({"other": 1}, {}).active
    # the appliance's variables activate nothing and change nothing (issue 15: TURINGBOX_GDN=auto reached the
    # workers raw and killed every one of them 58 s into startup)
    assert not resolve_settings(None, {"TURINGBOX_PLUGIN": "1", "TURINGBOX_REQUIRE_PLUGIN": "yes"}).active
    s = resolve_settings({"turingbox": {"strict_warmup": True, "gdn": "turbo", "cudagraph_capture_sizes": [4, 1, 2],
                                        "runtime_dir": "/run/tb"}}, {})
    assert s.active and s.strict_warmup and s.gdn == "turbo" and s.source == "additional_config"
    assert s.cudagraph_capture_sizes == (1, 2, 4) and s.runtime_dir == "/run/tb" and s.extra == {}
    env = {"TURINGBOX_STRICT_WARMUP": "1", "TURINGBOX_GDN": "fast", "TBPLUGIN_RUNTIME_DIR": "/x",
           "TBPLUGIN_BENCHMARK_MODE": "1"}
    s2 = resolve_settings({"turingbox": {"gdn": "vllm"}}, env)
    # the section's keys, the contract's defaults for the rest; the ENGINE_ENV variables from the env
    assert (s2.strict_warmup, s2.gdn, s2.prune_autotune, s2.runtime_dir, s2.benchmark_mode) == (
        False, "vllm", True, "/x", True)
    # the appliance's settings of the same meaning are not the plugin's variables: they change nothing here
    s3 = resolve_settings({"turingbox": {}}, {"TURINGBOX_RUNTIME_DIR": "/x", "TURINGBOX_BENCHMARK_MODE": "1"})
    assert (s3.runtime_dir, s3.benchmark_mode) == (None, False)
    s4 = resolve_settings({"turingbox": {"gdn": "auto"}}, {})
    assert s4.gdn == "auto" and s4.gdn_path((7, 5)) == "turbo" and s4.gdn_path((9, 0)) == "vllm"
    assert s4.gdn_path(None) == "vllm"
    with pytest.raises(ValueError, match="additional_config.turingbox.gdn = 'fast' is not one of auto, turbo, vllm"):
        resolve_settings({"turingbox": {"gdn": "fast"}}, {})
    with pytest.raises(ValueError, match="TBPLUGIN_BENCHMARK_MODE = 'maybe' is not a boolean"):
        resolve_settings({"turingbox": {}}, {"TBPLUGIN_BENCHMARK_MODE": "maybe"})
    # the autotune compile threads: a CPU count, in the engine's environment (no kernel changes with it, and vLLM
    # hashes additional_config into its compile-cache key); unset or empty: the plugin's own default
    assert resolve_settings({"turingbox": {}}, {"TBPLUGIN_AUTOTUNE_COMPILE_THREADS": "3"}).autotune_compile_threads == 3
    assert resolve_settings({"turingbox": {}}, {"TBPLUGIN_AUTOTUNE_COMPILE_THREADS": ""}).autotune_compile_threads is None
    assert resolve_settings({"turingbox": {}}, {}).autotune_compile_threads is None
    for bad in ("0", "-2", "four", "1.5"):
        with pytest.raises(ValueError, match=f"TBPLUGIN_AUTOTUNE_COMPILE_THREADS = '{bad}' is not a whole number > 0"):
            resolve_settings({"turingbox": {}}, {"TBPLUGIN_AUTOTUNE_COMPILE_THREADS": bad})
    for bad in ({"turingbox": {"gdn": "warp"}}, {"turingbox": {"strict_warmup": "maybe"}},
                {"turingbox": {"cudagraph_capture_sizes": [0]}}, {"turingbox": {"max_num_seqs": -1}},
                {"turingbox": {"cudagraph_capture_sizes": [True]}}, {"turingbox": []}):
        with pytest.raises(ValueError):
            resolve_settings(bad, {})
    assert turingbox_section('{"turingbox": true}') == {}
    assert argv_additional_config(["serve", "--additional-config", "{}"]) == "{}"
    assert argv_additional_config(["serve"]) is None


# read at collection, before any test runs: a test that puts the CPU copy on this process's sys.path
# (turingbox/plan/test_plan_vllm.py) does not make vLLM importable in a child
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


def _with_vllm(env: dict) -> dict:
    """vLLM importable in a child: the installed package (the image) or make test-setup's CPU copy."""
    if VLLM_INSTALLED:
        return env
    root = vllm_source_root("plugins/__init__.py")
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))}


def test_vllm_plugins_empty_never_loads_plugin():
    code = ("from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
            "import sys\nprint('turingbox_plugin' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=_with_vllm({**os.environ, "VLLM_PLUGINS": ""}))
    assert out.stdout.strip().splitlines()[-1] == "False", out.stderr
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env=_with_vllm({k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"}))
    assert out.stdout.strip().splitlines()[-1] == "True", out.stderr


WORKER_CHECK = """
from vllm.v1.worker.gpu_worker import Worker
from turingbox_plugin.worker import TuringboxWorker, deferred_jit_monitor
from vllm.triton_utils import jit_monitor
assert issubclass(TuringboxWorker, Worker)
real = jit_monitor.activate
with deferred_jit_monitor() as calls:
    jit_monitor.activate()
    assert calls == [True] and not jit_monitor.is_active()
assert jit_monitor.activate is real
print("ok")
"""


def test_worker_class_subclasses_vllm_gpu_worker():
    # in a child: vLLM on this process's sys.path would change what the later tests find
    out = subprocess.run([sys.executable, "-c", WORKER_CHECK], capture_output=True, text=True, timeout=300,
                         env=_with_vllm(dict(os.environ)))
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ok", out.stderr[-3000:]


WORKER_KV_CHECK = """
import json, sys, tempfile
from vllm.config.cache import CacheConfig
from vllm.v1.worker.gpu_worker import Worker
from turingbox_plugin.status import StatusWriter, read_worker_status
from turingbox_plugin.worker import TuringboxWorker
# vLLM's profile needs a GPU: its result stands in, the override around it is the real one
Worker.determine_available_memory = lambda self: self.cache_config.kv_cache_memory_bytes or 81 * 2**30
out = {}
for name, cache in (("profiled", CacheConfig()), ("given", CacheConfig(kv_cache_memory_bytes=40 * 2**30))):
    runtime = tempfile.mkdtemp()
    worker = TuringboxWorker.__new__(TuringboxWorker)
    worker.cache_config, worker.tb_status = cache, StatusWriter(runtime, 0, {"stage": "compiling"})
    returned = worker.determine_available_memory()
    out[name] = {"returned": returned, "status": read_worker_status(runtime)[0].get("kv_cache")}
print(json.dumps(out))
"""


def test_worker_reports_the_kv_size_vllm_sized_and_whether_it_was_given():
    out = subprocess.run([sys.executable, "-c", WORKER_KV_CHECK], capture_output=True, text=True, timeout=300,
                         env=_with_vllm(dict(os.environ)))
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["profiled"] == {"returned": 81 << 30, "status": {"bytes": 81 << 30, "given": False}}
    assert got["given"] == {"returned": 40 << 30, "status": {"bytes": 40 << 30, "given": True}}
