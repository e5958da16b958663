"""Run in a child process with vLLM 0.21.0's source on sys.path (CPU, no CUDA): vLLM's real
MultiModalRegistry.supports_multimodal_inputs and MultiModalConfig, before and after
turingbox_plugin.vllm_fixes.skip_text_only_model_import. The model-class import it avoids is
`_create_processing_info`, replaced here by a recorder shaped like vLLM's (it returns processing info whose
supported_mm_limits name Qwen3.6's modalities). argv: vllm_root mode (unpatched | patched | moved).
Prints one JSON object."""
import json
import logging
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, sys.argv[1])
mode = sys.argv[2]

from types import SimpleNamespace  # noqa: E402

from vllm.config.multimodal import MultiModalConfig  # noqa: E402
from vllm.multimodal.registry import MultiModalRegistry  # noqa: E402

from turingbox_plugin import vllm_fixes  # noqa: E402

imports = []
said = []          # the plugin's log lines (vLLM's "running in text-only mode" line is what timelines look for)


class Said(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())


# on vLLM's own "vllm" logger, as configured by vLLM at import (level INFO, no propagation): a line the plugin logs
# elsewhere never reaches vLLM's log (session 9's GPU log had no text-only line for that reason)
logging.getLogger("vllm").addHandler(Said())


def create_processing_info(self, model_config, tokenizer=None):
    imports.append(model_config.model)           # vLLM imports the model class here
    return SimpleNamespace(supported_mm_limits={"image": None, "video": None})


MultiModalRegistry._create_processing_info = create_processing_info
out = {}
if mode == "moved":
    vllm_fixes.MM_CHECK_LIMITS_AFTER_IMPORT = ("info = self._create_processing_info_moved(model_config)",)
if mode != "unpatched":
    out["applied"] = vllm_fixes.skip_text_only_model_import()
    out["applied_again"] = vllm_fixes.skip_text_only_model_import()


def ask(name, multimodal=True, **mm):
    imports.clear()
    config = SimpleNamespace(model=name, is_multimodal_model=multimodal,
                             get_multimodal_config=lambda: MultiModalConfig(**mm))
    answer = MultiModalRegistry().supports_multimodal_inputs(config)
    return {"supports": answer, "model_imports": len(imports)}


out["language_model_only"] = ask("lmo", language_model_only=True)
out["said_for_language_model_only"] = list(said)       # before vLLM's own info_once for the cases below
out["language_model_only_with_embeds"] = ask("lmo-embeds", language_model_only=True, enable_mm_embeds=True)
out["limits_zero"] = ask("zero", limit_per_prompt={"image": 0, "video": 0})
out["images"] = ask("images", limit_per_prompt={"image": 1, "video": 0})
out["text_model"] = ask("text", multimodal=False)
out["premise"] = MultiModalConfig(language_model_only=True).get_limit_per_prompt("audio")
out["said"] = said
print(json.dumps(out))
