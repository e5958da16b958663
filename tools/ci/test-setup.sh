#!/usr/bin/env bash
# Everything `make test` needs on a bare Debian 12 machine (root, no GPU), each step skipped when already
# done: the apt tools, the venv (`make dev`, when missing or its inputs changed), the package sources some
# tests read (unpacked under .cache/ in the checkout, never into the venv: vLLM must stay not-installed
# there), a running Docker engine with Compose v2 and buildx, and the Debian stand-in for the CUDA base.
# Called by `make test-setup`; prints each step's seconds.
#
# Env: VENV (default .venv), DEV_INPUTS (the files `make dev` installs from; the Makefile passes them),
#      TURINGBOX_TEST_BASE_IMAGE (default turingbox-base:bookworm), SOURCES (default .cache).
set -euo pipefail
cd "$(dirname "$0")/../.."

export PIP_DISABLE_PIP_VERSION_CHECK=1
VENV=${VENV:-.venv}
DEV_INPUTS=${DEV_INPUTS:-pyproject.toml plugin/pyproject.toml requirements/structured-output.txt}
BASE_TAG=${TURINGBOX_TEST_BASE_IMAGE:-turingbox-base:bookworm}
SOURCES=${SOURCES:-.cache}
setup_started=$(date +%s)

phase() {  # phase NAME COMMAND...: run it, print how long it took; stop at the first failure
  local name=$1 started rc
  shift
  echo "=== ${name}"
  started=$(date +%s)
  set +e
  "$@"
  rc=$?
  set -e
  echo "=== ${name}: $(( $(date +%s) - started )) s (exit ${rc})"
  [ "$rc" -eq 0 ] || exit "$rc"
}

apt_tools() {  # promtool (tests/deploy's alert-rule tests; Debian's package, no server started) and ninja
  local need=()
  command -v promtool >/dev/null || need+=(prometheus)
  command -v ninja >/dev/null || need+=(ninja-build)
  [ ${#need[@]} -gt 0 ] || { echo "apt tools: promtool and ninja are installed"; return 0; }
  if [ "$(id -u)" != 0 ]; then
    echo "test-setup: ${need[*]} must be installed and that needs root: run sudo make test-setup (or sudo apt-get install ${need[*]}), then make test again." >&2
    return 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "apt tools: installed ${need[*]}"
}

venv() {  # `make dev` when the venv is missing, broken, or older than its inputs
  local key
  # shellcheck disable=SC2086  # DEV_INPUTS is a list of paths
  key=$(cat $DEV_INPUTS | sha256sum | cut -c1-16)
  if [ "$(cat "$VENV/.turingbox-dev-key" 2>/dev/null)" = "$key" ] \
      && "$VENV/bin/python" -c 'import turingbox, turingbox_plugin, pytest' 2>/dev/null; then
    echo "venv: $VENV is up to date ($key)"
    return 0
  fi
  PIP_QUIET=${PIP_QUIET:-1} make -s --no-print-directory dev VENV="$VENV"
}

sources() {
  export PYTHON="$VENV/bin/python"
  # vLLM 0.21's Python code (no CUDA stack) and the pure-Python packages its config code imports:
  # tests/turingbox/plan/test_plan_vllm.py (argv parser, KV pool arithmetic), the AOT spec derivations, diagnosis texts
  tools/ci/pip-target.sh "$SOURCES/vllm-cpu" -c requirements/image-lock.txt vllm==0.21.0 cbor2 gguf aiohttp \
    multidict yarl propcache aiohappyeyeballs aiosignal frozenlist psutil pyzmq openai-harmony msgspec pybase64 \
    cachetools uvloop partial-json-parser llguidance cloudpickle py-cpuinfo einops
  # transformers 4.57.6, what a fresh `pip install vllm==0.21.0` resolves, with the tokenizers and hub it accepts:
  # tests/turingbox/model/test_demo_tokenizer_transformers.py puts it in front of the venv's 5.x
  tools/ci/pip-target.sh "$SOURCES/transformers-4.57" transformers==4.57.6 tokenizers==0.22.2 huggingface-hub==0.36.2
  # FlashInfer 0.6.8.post1's JIT sources: tests/turingbox_warmup/image/test_flashinfer_*.py (derived module specs, an sm_75 compile)
  tools/ci/pip-target.sh "$SOURCES/flashinfer-cpu" -c requirements/image-lock.txt flashinfer-python==0.6.8.post1
}

# first: it installs python3-venv, which `make dev` needs on Debian
phase "docker tools (apt)" tools/ci/install-docker-tools.sh
phase "apt tools (promtool, ninja)" apt_tools
phase "python venv (make dev)" venv
phase "package sources ($SOURCES)" sources
phase "docker engine" tools/ci/start-dockerd.sh
phase "stand-in base image $BASE_TAG" tools/ci/build-base.sh "$BASE_TAG"
echo "=== test-setup: $(( $(date +%s) - setup_started )) s"
