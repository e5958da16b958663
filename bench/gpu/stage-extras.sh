#!/usr/bin/env bash
# Here (not on the GPU machine, which reaches no registry), after restage.sh: `.device-wheels/extra/`, one more folder
# for one more staging call (`cp -r .device-wheels/extra/. /tmp/dw/`), holding what some phases want beside vLLM:
#   py_spy-*.whl                       STARTUP_DUMPS, startupx (session.sh installs it from /tmp/dw)
#   runai_model_streamer-*, humanize-* ckptload's runai_streamer row (the image's pins, requirements/image-lock.txt)
#   fi-aot/                            FlashInfer's sampling module for the device's GPUs (sm_90: H100 and H200),
#                                      built here without a GPU by the image's own builder, in the layout
#                                      TURINGBOX_AOT_FLASHINFER_DIR names; the cold A/B gives it to turingbox (as the
#                                      image does) and to plain vLLM (bench/startup.py --plain-flashinfer-prebuilt,
#                                      FlashInfer's flashinfer-jit-cache route). Without it every cold start pays
#                                      FlashInfer's nvcc, 89-147 s (docs/startup.md "Session 28").
# ~2 min on 2 cores (the nvcc build ~95 s); needs `make dev`'s venv. FI_AOT_ARCH=9.0 by default.
set -euo pipefail
cd "$(dirname "$0")/../.."
DW=${1:-.device-wheels}
X="$DW/extra"
ARCH=${FI_AOT_ARCH:-9.0}
PY=${PYTHON:-.venv/bin/python}
lock() { grep -E "^$1==" requirements/image-lock.txt | cut -d= -f3; }
rm -rf "$X" && mkdir -p "$X"
dl() { "$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux2014_x86_64 --python-version 3.12 \
         -d "$X" "$@"; }
dl py-spy==0.4.3
dl "runai-model-streamer==$(lock runai-model-streamer)" "humanize==$(lock humanize)"

# FlashInfer and the CUDA 13.0 nvcc wheels the Dockerfile's flashinfer-aot stage uses (CUDA_NVCC_WHEELS), beside the
# venv's torch: pip --target, so the venv is left as it is.
site=$(mktemp -d /tmp/fi-aot-site.XXXXXX)
trap 'rm -rf "$site"' EXIT
nvcc_wheels=$(sed -n 's/^ARG CUDA_NVCC_WHEELS="\(.*\)"$/\1/p' Dockerfile)
"$PY" -m pip install -q --no-deps --target "$site" "flashinfer-python==$(lock flashinfer-python)" \
  $nvcc_wheels \
  "nvidia-cuda-runtime==$(lock nvidia-cuda-runtime)" "nvidia-curand==$(lock nvidia-curand)"
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m turingbox_warmup.image.flashinfer_aot build --arch "$ARCH" \
  --only sampling --out "$X/fi-aot"
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m turingbox_warmup.image.flashinfer_aot check --arch "$ARCH" \
  --dir "$X/fi-aot"
du -sh "$X" && ls "$X"
