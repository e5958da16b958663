#!/usr/bin/env bash
# Unpack packages with `pip install --no-deps --target DIR` once: the sources some tests read without
# installing them into the venv (vLLM 0.21's Python code, FlashInfer's JIT sources, transformers 4.57).
# DIR/.pip-target-key records the arguments and the constraint files' contents; when they are unchanged
# this returns at once, otherwise DIR is rebuilt beside itself and swapped in, so a half-finished install
# never looks done.
#
# Usage: tools/ci/pip-target.sh DIR [pip install arguments...]
# Env:   PYTHON (default .venv/bin/python), FORCE=1 to reinstall.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 DIR [pip install arguments...]" >&2; exit 2; }
dir=$1
shift
python=${PYTHON:-.venv/bin/python}

key=$( {
  printf '%s\n' "$@"
  prev=""
  for arg in "$@"; do            # a constraint file's pins are part of what gets installed
    if [ "$prev" = -c ] || [ "$prev" = --constraint ]; then cat "$arg"; fi
    prev=$arg
  done
} | sha256sum | cut -c1-16)

if [ "${FORCE:-0}" != 1 ] && [ "$(cat "$dir/.pip-target-key" 2>/dev/null)" = "$key" ]; then
  echo "pip-target: $dir is up to date ($key)"
  exit 0
fi

new="$dir.new"
rm -rf "$new"
mkdir -p "$(dirname "$dir")"
"$python" -m pip install -q --no-deps --target "$new" "$@"
echo "$key" >"$new/.pip-target-key"
rm -rf "$dir"
mv "$new" "$dir"
echo "pip-target: installed into $dir ($key)"
