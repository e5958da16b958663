"""The load format (issue 35 item 3): TURINGBOX_LOAD_FORMAT over the fake inventories and the real architecture.

auto picks runai_streamer for a real checkpoint at TP=1 where runai_model_streamer is importable (measured fastest,
session 20), else safetensors with --safetensors-load-strategy prefetch; the demo keeps its dummy weights; a set
value maps to vLLM's flags, and one whose package is missing is refused in one sentence (exit 2). Whether a package
is importable is a value the edge passes in (from_settings.load_packages), so each case here names it; so is which
weight files the model directory holds (from_settings.weight_files): with only PyTorch .bin/.pt weights, auto plans
vLLM's own auto format and a set safetensors-only format is refused.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.support.plan_factory import plan_from_env, plan_settings
from tests.turingbox.plan.test_planner import SOFTWARE, fixture, write_model
from turingbox import config as S
from turingbox.errors import UsageError
from turingbox.gpus.inventory import read_inventory
from turingbox.plan import from_settings
from turingbox.plan.planner import LOAD_FORMAT_ARGS, LOAD_FORMAT_PACKAGES, make_plan
from turingbox_plugin.model_config import load_model_config

RUNAI = frozenset({"runai_model_streamer"})
BOTH = frozenset(module for module, _dist in LOAD_FORMAT_PACKAGES.values())
NONE: frozenset[str] = frozenset()
EXPLICIT = [v for v in S.LOAD_FORMATS if v != "auto"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("load-models")
    return {"awq": load_model_config(write_model(root, "qwen-awq", awq=True)),
            "demo": load_model_config(write_model(root, "qwen-demo", demo=True))}


def plan(models, inventory="1xh200", model="awq", packages=NONE, weights=None, **settings):
    return make_plan(read_inventory(fixture(inventory), {}), models[model], plan_settings(settings), SOFTWARE,
                     packages, weight_files=weights)


def load_args(p) -> list[str]:
    """The load flags of a plan's argv: --load-format and --safetensors-load-strategy with their values."""
    a, out = list(p.vllm_args), []
    for flag in ("--load-format", "--safetensors-load-strategy"):
        if flag in a:
            out += [flag, a[a.index(flag) + 1]]
            assert a.count(flag) == 1, a
    return out


def load_reasons(p) -> list[str]:
    return [r for r in p.reasons if r.startswith("load format")]


# ---- the table: (id, inventory, model, packages, settings, (TP, DP), load format, words of its one reason) -------
# settings may carry "weights": the weight_files fact the edge passes (None, unknown, when absent).

CASES = [
    ("auto-demo", "1xh200", "demo", BOTH, {}, (1, 1), "dummy", None),
    ("auto-real-tp1-runai", "1xh200", "awq", RUNAI, {}, (1, 1), "runai_streamer",
     ["fastest measured at TP=1", "14.2 s", "18.2 s safetensors", "19.5 GB", "H200 2026-12-05"]),
    ("auto-real-tp1-no-package", "1xh200", "awq", NONE, {}, (1, 1), "safetensors-prefetch",
     ["runai-model-streamer", "not installed", "needs no package", "14.2 s"]),
    ("auto-real-tp2", "2xh200", "awq", BOTH, {}, (2, 1), "safetensors-prefetch",
     ["only TP=1 with one engine was measured", "at TP=2", "needs no package", "page cache"]),
    ("auto-real-tp4-seed", "4x2080ti-22g", "awq", RUNAI, {}, (4, 1), "safetensors-prefetch",
     ["only TP=1 with one engine was measured", "at TP=4"]),
    ("auto-real-tp1-dp2", "2xh200", "awq", RUNAI, {"objective": "throughput"}, (1, 2), "safetensors-prefetch",
     ["only TP=1 with one engine was measured", "at TP=1 x DP=2"]),
    *[(f"set-{v}", "1xh200", "awq", BOTH, {"load_format": v}, (1, 1), v, [f"set by --load-format/TURINGBOX_LOAD_FORMAT"])
      for v in EXPLICIT],
    ("set-prefetch-at-tp2", "2xh200", "awq", NONE, {"load_format": "safetensors-prefetch"}, (2, 1),
     "safetensors-prefetch", ["set by"]),
    ("set-runai-at-tp2", "2xh200", "awq", RUNAI, {"load_format": "runai_streamer"}, (2, 1), "runai_streamer",
     ["set by"]),
    *[(f"demo-set-{v}", "1xh200", "demo", NONE, {"load_format": v}, (1, 1), "dummy",
       [f"TURINGBOX_LOAD_FORMAT {v} does not apply to the demo model"]) for v in EXPLICIT],
    # which weight files the directory holds: only .bin/.pt -> vLLM's own auto; safetensors or unknown -> as above
    ("auto-pt-tp1", "1xh200", "awq", BOTH, {"weights": "pt"}, (1, 1), "auto",
     ["vLLM's default", "qwen-awq holds no *.safetensors", "PyTorch .bin", "runai_streamer and safetensors cannot"]),
    ("auto-pt-tp2", "2xh200", "awq", NONE, {"weights": "pt"}, (2, 1), "auto", ["vLLM's default", ".bin"]),
    ("auto-safetensors-tp1", "1xh200", "awq", RUNAI, {"weights": "safetensors"}, (1, 1), "runai_streamer",
     ["fastest measured at TP=1"]),
    ("auto-unknown-tp1", "1xh200", "awq", RUNAI, {"weights": None}, (1, 1), "runai_streamer",
     ["fastest measured at TP=1"]),
    ("auto-unknown-no-package", "1xh200", "awq", NONE, {"weights": None}, (1, 1), "safetensors-prefetch",
     ["not installed"]),
    ("auto-safetensors-tp2", "2xh200", "awq", BOTH, {"weights": "safetensors"}, (2, 1), "safetensors-prefetch",
     ["at TP=2"]),
    ("demo-pt", "1xh200", "demo", BOTH, {"weights": "pt"}, (1, 1), "dummy", None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_load_format_table(models, case):
    _id, inventory, model, packages, settings, (tp, dp), expected, words = case
    p = plan(models, inventory, model, packages, **settings)
    assert (p.tensor_parallel_size, p.data_parallel_size) == (tp, dp)
    assert p.load_format == expected and p.to_dict()["load_format"] == expected
    assert load_args(p) == list(LOAD_FORMAT_ARGS[expected])
    reasons = load_reasons(p)
    if words is None:
        assert reasons == [] and any("--load-format dummy" in r for r in p.reasons)
    else:
        assert len(reasons) == 1 and reasons[0].startswith(f"load format {expected}"), reasons
        for w in words:
            assert w in reasons[0], (w, reasons[0])
        assert reasons[0].endswith(".") and "\n" not in reasons[0]


def test_each_value_maps_to_vllms_flags():
    assert LOAD_FORMAT_ARGS == {
        "dummy": ("--load-format", "dummy"),
        "auto": ("--load-format", "auto"),
        "safetensors": ("--load-format", "safetensors"),
        "safetensors-prefetch": ("--load-format", "safetensors", "--safetensors-load-strategy", "prefetch"),
        "runai_streamer": ("--load-format", "runai_streamer"),
        "fastsafetensors": ("--load-format", "fastsafetensors"),
    }
    assert set(LOAD_FORMAT_ARGS) == set(S.LOAD_FORMATS) | {"dummy"}


# ---- (id, set value, packages): a safetensors-only format over a directory of .bin/.pt weights is refused -------

PT_REFUSALS = [
    *[(f"set-{v}-pt", v, BOTH) for v in EXPLICIT],
    ("set-runai-pt-no-package", "runai_streamer", NONE),      # the weights are named first: a package would not help
]


@pytest.mark.parametrize("case", PT_REFUSALS, ids=[c[0] for c in PT_REFUSALS])
def test_a_set_safetensors_format_over_pt_weights_is_refused(models, case):
    _id, value, packages = case
    with pytest.raises(UsageError) as info:
        plan(models, packages=packages, weights="pt", load_format=value)
    text = str(info.value)
    assert "\n" not in text and text.endswith(".")
    assert text.startswith(f"--load-format/TURINGBOX_LOAD_FORMAT {value} reads only *.safetensors files"), text
    assert f"{models['awq'].path} holds only PyTorch .bin/.pt weights" in text and "set auto" in text
    # the same setting over safetensors (or unknown) weights plans
    assert plan(models, packages=BOTH, weights="safetensors", load_format=value).load_format == value
    assert plan(models, packages=BOTH, load_format=value).load_format == value


@pytest.mark.parametrize("value,module,dist", [(v, *LOAD_FORMAT_PACKAGES[v]) for v in sorted(LOAD_FORMAT_PACKAGES)])
def test_a_set_format_without_its_package_is_refused(models, value, module, dist):
    others = BOTH - {module}
    with pytest.raises(UsageError) as info:
        plan(models, packages=others, load_format=value)
    text = str(info.value)
    assert "\n" not in text and text.endswith(".")
    assert f"--load-format/TURINGBOX_LOAD_FORMAT {value} needs the Python package {dist}" in text
    # auto never refuses: it falls back to what needs no package
    assert plan(models, packages=NONE).load_format == "safetensors-prefetch"


def test_the_demo_plans_whatever_is_installed(models):
    for value in S.LOAD_FORMATS:
        assert plan(models, model="demo", packages=NONE, load_format=value).load_format == "dummy"


def test_the_load_format_changes_no_cache_key(models):
    """vLLM 0.21's LoadConfig.compute_hash has no factors: how the weights are read compiles nothing differently."""
    keys = {plan(models, packages=BOTH, load_format=v).cache_key for v in S.LOAD_FORMATS}
    assert len(keys) == 1
    assert "load_format" not in plan(models, packages=BOTH).cache_inputs["plan"]


# ---- the setting ------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", S.LOAD_FORMATS)
def test_every_documented_value_is_accepted(value):
    assert value in S.REGISTRY["load_format"].help
    assert plan_settings(load_format=value).load_format == value
    assert plan_settings(load_format=value.upper()).load_format == value


def test_the_default_is_auto():
    assert S.REGISTRY["load_format"].default == "auto" and plan_settings().load_format == "auto"
    assert (S.REGISTRY["load_format"].flag_name, S.REGISTRY["load_format"].env_name) == (
        "--load-format", "TURINGBOX_LOAD_FORMAT")


@pytest.mark.parametrize("value", ["dummy", "pt", "safetensors_prefetch", "runai", ""])
def test_a_bad_value_names_the_setting(value):
    if value == "":
        assert plan_settings(load_format=value).load_format == "auto"     # empty = unset
        return
    with pytest.raises(UsageError) as info:
        plan_settings(load_format=value)
    text = str(info.value)
    assert text.startswith(f"TURINGBOX_LOAD_FORMAT {value!r} is invalid: must be one of auto, safetensors")
    assert "\n" not in text


# ---- the edge: which packages are importable ----------------------------------------------------------

def test_load_packages_are_what_find_spec_finds(monkeypatch):
    found = {"runai_model_streamer"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name in found else None)
    assert from_settings.load_packages() == frozenset({"runai_model_streamer"})
    found = set()
    assert from_settings.load_packages() == frozenset()

    def broken(name, *a):
        raise ValueError(f"{name}.__spec__ is None")
    monkeypatch.setattr(importlib.util, "find_spec", broken)
    assert from_settings.load_packages() == frozenset()


@pytest.mark.parametrize("files,expected", [
    (["model.bin"], "pt"),
    (["consolidated.pt"], "pt"),
    (["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin", "pytorch_model.bin.index.json"], "pt"),
    (["model.safetensors"], "safetensors"),
    (["model.safetensors", "pytorch_model.bin"], "safetensors"),
    (["model-00001-of-00002.safetensors", "model.safetensors.index.json"], "safetensors"),
    ([], None),
    (["tokenizer.json", "sub/model.bin", "sub/model.safetensors"], None),     # vLLM looks at the top level only
])
def test_weight_files_are_what_the_directory_holds(tmp_path, files, expected):
    model_dir = write_model(tmp_path, "qwen-awq", awq=True)
    for name in files:
        f = tmp_path / "qwen-awq" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"\0")
    assert from_settings.weight_files(model_dir) == expected
    assert from_settings.weight_files(str(tmp_path / "absent")) is None


def test_plan_from_settings_passes_the_weight_files(tmp_path):
    """The edge end to end: a local directory with only model.bin plans vLLM's auto; a set prefetch is refused."""
    model_dir = write_model(tmp_path, "qwen-awq", awq=True)
    env = {"TURINGBOX_MODEL": model_dir, "TURINGBOX_GPUS_JSON": fixture("1xh200")}
    assert plan_from_env(env, write_demo=False).load_format in ("runai_streamer", "safetensors-prefetch")
    (tmp_path / "qwen-awq" / "model.bin").write_bytes(b"\0")
    p = plan_from_env(env, write_demo=False)
    assert p.load_format == "auto" and load_args(p) == ["--load-format", "auto"]
    with pytest.raises(UsageError) as info:
        plan_from_env({**env, "TURINGBOX_LOAD_FORMAT": "safetensors-prefetch"}, write_demo=False)
    assert "TURINGBOX_LOAD_FORMAT safetensors-prefetch reads only *.safetensors" in str(info.value)


def _cli_plan(model_dir, env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TURINGBOX_")
            and k not in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "turingbox", "plan", "--json", "--gpus-json", fixture("1xh200"),
                           "--model", model_dir], capture_output=True, text=True, env=full, timeout=120)


def test_turingbox_plan_shows_the_load_format_and_refuses_a_missing_package(tmp_path):
    """End to end with this Python's packages: what `turingbox plan --json` shows, and exit 2 in one line for a
    set format whose package this Python cannot import."""
    model_dir = write_model(tmp_path, "qwen-awq", awq=True)
    installed = from_settings.load_packages()
    r = _cli_plan(model_dir, {})
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["load_format"] == ("runai_streamer" if "runai_model_streamer" in installed else "safetensors-prefetch")
    missing = [v for v, (module, _dist) in sorted(LOAD_FORMAT_PACKAGES.items()) if module not in installed]
    for value in missing:
        r = _cli_plan(model_dir, {"TURINGBOX_LOAD_FORMAT": value})
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 2 and r.stdout == "" and len(lines) == 1, (r.returncode, r.stderr)
        assert "TURINGBOX_LOAD_FORMAT" in lines[0] and LOAD_FORMAT_PACKAGES[value][1] in lines[0], lines[0]
    r = _cli_plan(model_dir, {"TURINGBOX_LOAD_FORMAT": "safetensors"})
    assert r.returncode == 0 and json.loads(r.stdout)["load_format"] == "safetensors", r.stderr
