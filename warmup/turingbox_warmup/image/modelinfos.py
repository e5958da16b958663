"""vLLM's model-class facts for the image's architectures, computed at image build instead of at first start.

Why: before it builds its config, vLLM's API server asks its registry what each architecture's class
supports (multimodal, hybrid, MTP...). Without a cached answer in `$VLLM_CACHE_ROOT/modelinfos/` it imports
the model class in a fresh interpreter, once per architecture, one after the other: on the H200 the
Qwen3.6 class and its MTP drafter cost 44 s (session 8's seed) to 66 s (session 9's AWQ start) of every start
with an empty cache entry, before vLLM has even launched its engine (docs/startup.md). vLLM stores the answer
as JSON keyed by a hash of the model's source file, and ignores a file whose hash does not match its own
source, so an answer computed by the image's own vLLM is valid for that image whatever the GPU: the facts are
class attributes, not device properties.

This runs vLLM's own inspection (`ModelRegistry._try_inspect_model_cls`, the call its config makes) with
VLLM_CACHE_ROOT pointed at OUT, so vLLM writes the files itself; turingbox.cache.store copies them into the
vllm/ folder of every new cache entry (setting aot_modelinfos_dir).

CLI (in the Docker build, no GPU):  python -m turingbox_warmup.image.modelinfos --out DIR [--arch A ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from turingbox.config import envs
from turingbox.cache.store import MODELINFOS

# The image's model (Qwen3.6, config in turingbox/data/qwen3.6-27b.json) and the MTP drafter vLLM builds for it.
ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MTP")


def build(out: str, architectures: tuple[str, ...] = ARCHITECTURES) -> list[str]:
    """Write vLLM's modelinfo JSON for each architecture under out/modelinfos; returns the files."""
    # environ: vLLM's registry writes under VLLM_CACHE_ROOT (read by vllm.envs when the registry asks)
    envs.set_variable("VLLM_CACHE_ROOT", os.path.abspath(out))
    from vllm.model_executor.models.registry import ModelRegistry

    missing = [a for a in architectures if ModelRegistry._try_inspect_model_cls(a) is None]
    if missing:
        raise SystemExit(f"modelinfos: vLLM could not inspect {', '.join(missing)}; "
                         f"its registry knows {len(ModelRegistry.get_supported_archs())} architectures.")
    # the file vLLM names after each class (registry._LazyRegisteredModel._get_cache_filename)
    files = []
    for arch in architectures:
        model = ModelRegistry.models[arch]
        name = f"{model.module_name}-{model.class_name}".replace(".", "-") + ".json"
        files.append(os.path.join(out, MODELINFOS, name))
    absent = [f for f in files if not os.path.isfile(f)]
    if absent:
        raise SystemExit(f"modelinfos: vLLM did not write {', '.join(absent)} (a class outside vLLM's models "
                         "package is not cached).")
    for path in [out, os.path.join(out, MODELINFOS), *files]:      # vLLM writes 0600; the image's user reads them
        os.chmod(path, 0o755 if os.path.isdir(path) else 0o644)
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turingbox_warmup.image.modelinfos", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="directory that becomes aot_modelinfos_dir (files in OUT/modelinfos)")
    p.add_argument("--arch", action="append", help="architecture (repeatable; default: %s)" % ", ".join(ARCHITECTURES))
    a = p.parse_args(argv)
    files = build(a.out, tuple(a.arch or ARCHITECTURES))
    for f in files:
        print(f"modelinfos: {f} (hash {json.load(open(f))['hash'][:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
