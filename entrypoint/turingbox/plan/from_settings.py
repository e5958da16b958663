"""Plan from the typed settings: read the GPUs and the model (a directory, a Hugging Face id or the built-in demo
model, plan/demo_choice.py), then the pure `turingbox.plan.planner.make_plan`.

The side effects live here (NVML or --gpus-json, config.json, the hub, package versions, which optional weight
loaders are importable, which weight files a model directory holds); the decisions live in the planner. serve,
warmup, doctor and the FlashInfer build call plan_from_settings with what they loaded once.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import replace
from typing import Iterable, Mapping

from turingbox import config
from turingbox.config import DemoSettings, PlanSettings
from turingbox.errors import UsageError
from turingbox.gpus.inventory import read_inventory
from turingbox.model import hub
from turingbox.plan.demo_choice import plan_demo
from turingbox.plan.fingerprint import software_versions
from turingbox.plan.planner import LOAD_FORMAT_PACKAGES, make_plan
from turingbox.plan.types import Plan
from turingbox_plugin.contract import load_model_config, model_config_from_dict
from turingbox_plugin.errors import ToolError


def _software() -> dict[str, str]:
    return software_versions()


def load_packages() -> frozenset[str]:
    """The import names of the optional weight loaders (planner.LOAD_FORMAT_PACKAGES) this Python can import: vLLM
    runs in it (serve's default vllm_command). Found, not imported: find_spec imports nothing of a top-level name."""
    found = set()
    for module, _dist in LOAD_FORMAT_PACKAGES.values():
        try:
            if importlib.util.find_spec(module) is not None:
                found.add(module)
        except (ImportError, ValueError):     # a broken or half-removed install counts as absent
            pass
    return frozenset(found)


def weight_files(path: str) -> str | None:
    """Which weight files the model directory holds at its top level (where vLLM looks): "safetensors" if any
    *.safetensors, else "pt" if any *.bin/*.pt (PyTorch weights, which only vLLM's own auto format reads), else None
    (not known: no weights there yet)."""
    try:
        return weight_kind(e.name for e in os.scandir(path) if e.is_file())
    except OSError:
        return None


def weight_kind(names: Iterable[str]) -> str | None:
    """The weight_files fact of a checkpoint's top-level file names (a directory's, or a hub listing's paths):
    "safetensors", "pt" (only PyTorch .bin/.pt) or None (no weights named)."""
    names = [n for n in names if "/" not in n]
    if any(n.endswith(".safetensors") for n in names):
        return "safetensors"
    if any(n.endswith((".bin", ".pt")) for n in names):
        return "pt"
    return None


def _load_model(path: str):
    where = f"{config.REGISTRY['model'].flag_name}/{config.REGISTRY['model'].env_name} {path}"
    if os.path.isfile(path):
        raise UsageError(f"{where} is a file; it must be the model directory that holds config.json"
                         + (f" (here {os.path.dirname(path)})." if os.path.basename(path) == "config.json" else "."))
    if not os.path.exists(path):
        raise UsageError(f"{where} does not exist; it must be the model directory that holds config.json.")
    try:
        return load_model_config(path)
    except ToolError as exc:       # one sentence either way; callers catch UsageError
        raise UsageError(str(exc)) from None


def _plan_hub(inventory, settings: PlanSettings, demo: DemoSettings, software: dict, write: bool,
              loaders: frozenset[str]) -> Plan:
    """A Hugging Face id: plan from its config.json (turingbox.model.hub.model_config) for the snapshot directory
    serve keeps it in, served under the hub id unless --served-model-name says otherwise.

    write True (serve, warmup): config.json, the hub's listing and the ref go into the models volume; the weights
    follow in serve's downloading stage (hub.ensure_snapshot), after this plan showed they fit. write False
    (`turingbox plan`): nothing is written; config.json is read from the volume, or from the hub into memory, and
    the first reason says what serve would download.
    """


    source = hub.model_config(settings.model, settings.model_revision, demo.models_dir, write=write)
    digest = hashlib.sha256(json.dumps(source.config, sort_keys=True).encode()).hexdigest()   # load_model_config's
    try:
        model = model_config_from_dict(source.config, source.path, digest)
    except ToolError as exc:
        raise UsageError(f"{settings.model}: {exc}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise UsageError(f"{settings.model}: its {hub.CONFIG_FILE} has an unexpected value ({exc}).") from None
    plan = make_plan(inventory, model, replace(settings, served_model_name=settings.served_model_name
                                               or settings.model), software, loaders,
                     weight_files=weight_kind(f.path for f in source.listing.files) if source.listing else None)
    return replace(plan, reasons=(source.note, *plan.reasons))


def plan_from_settings(settings: PlanSettings, demo: DemoSettings, *, write_demo: bool = True,
                       environ: Mapping[str, str] | None = None) -> Plan:
    """Read the GPUs and the model (or the demo model), plan.

    write_demo: build the chosen demo model directory (serve and warmup need it on disk); `turingbox
    plan` passes False and plans from the demo's in-memory config. environ: where GPU visibility is read
    (NVIDIA_VISIBLE_DEVICES/CUDA_VISIBLE_DEVICES; the process environment when None).
    """

    inventory = read_inventory(settings.gpus_json, environ)
    software = _software()
    if config.is_hub_id(settings.model):
        return _plan_hub(inventory, settings, demo, software, write=write_demo, loaders=load_packages())
    if settings.model:
        return make_plan(inventory, _load_model(settings.model), settings, software, load_packages(),
                         weight_files=weight_files(settings.model))
    return plan_demo(inventory, settings, demo, software, write_demo)
