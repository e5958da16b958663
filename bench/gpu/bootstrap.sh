#!/usr/bin/env bash
# GPU machine: install vLLM 0.21.0 (from the staged wheel chunks in /tmp/dw) and this checkout into /tmp/site.
# Idempotent; keeps /tmp between calls while the machine stays warm.  Usage: source bench/gpu/bootstrap.sh
# Sourced: it stops the sourcing shell on a failed step (set -e), then gives the caller back its own errexit
# setting, so that a session script's failing phase does not end the whole session.
case $- in *e*) _tb_errexit=1 ;; *) _tb_errexit= ;; esac
set -e
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
# Two session lanes may source this at once: the installs and the build run under one lock.
exec 9>/tmp/bootstrap.lock; flock 9
if [ ! -d /tmp/site/vllm ]; then bash .device-wheels/install.sh; fi
# The project itself, reinstalled only when its sources changed: a second lane re-running pip would replace
# files under /tmp/site while the first lane's servers still import from them.
# (plugin/build and ./build are pip's build trees)
src_sum=$(find plugin entrypoint warmup pyproject.toml -type f -not -path '*/__pycache__/*' -not -path '*.egg-info/*' \
  -not -path '*/build/*' -not -name '*.pyc' -not -name '*.so' -print0 2>/dev/null \
  | sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
if [ "$(cat /tmp/site/.turingbox-src.sha256 2>/dev/null)" != "$src_sum" ]; then
  python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade --target /tmp/site ./plugin . \
    2>&1 | grep -v -E "^WARNING: Target directory|already exists" || true
  python3 -c "import turingbox, turingbox_plugin" && echo "$src_sum" > /tmp/site/.turingbox-src.sha256
fi
# The sm_75+ GDN kernels: built once per machine with nvcc (about a minute), found by the plugin through its own
# TBPLUGIN_GDN_LIB (turingbox_plugin.contract.GDN_LIB_ENV).
export TBPLUGIN_GDN_LIB=/tmp/gdnlib/libturingbox_gdn.so
gdn_sum=$(cat plugin/turingbox_plugin/csrc/* | sha256sum | cut -d' ' -f1)   # content: mtimes change every call
# TURINGBOX_SKIP_GDN_BUILD=1: sessions that never run the turbo path (sm_90 plans pick vLLM's GDN) save the minute.
if [ -z "${TURINGBOX_SKIP_GDN_BUILD:-}" ] && [ "$(cat /tmp/gdnlib/libturingbox_gdn.sha256 2>/dev/null)" != "$gdn_sum" ]; then
  GDN_LIB_OUT=$TBPLUGIN_GDN_LIB JOBS=8 bash plugin/build_gdn.sh >/tmp/gdn-build.log 2>&1 \
    && echo "$gdn_sum" > /tmp/gdnlib/libturingbox_gdn.sha256 || echo "GDN build failed: see /tmp/gdn-build.log"
fi
[ -d /tmp/demo ] || python3 -m turingbox demo-model /tmp/demo
# Unlock and close fd 9, so that the servers and scripts started later do not inherit the lock file.
flock -u 9; exec 9>&-
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
[ -n "$_tb_errexit" ] || set +e
unset _tb_errexit
