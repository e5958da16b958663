#!/usr/bin/env bash
# GPU machine, repository root as cwd:  bash bench/gpu/plugin_evidence.sh [plugin_evidence.py flags] [-- vllm flags]
# e.g.  bash bench/gpu/plugin_evidence.sh --mtp 3 --modes plugin,plain
# Writes $OUT/plugin-evidence.json, vllm-<mode>.log, bench-*.json, prefill-*.png; prints a summary table.
set -e
source bench/gpu/bootstrap.sh
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m turingbox_plugin.cli verify --json > "$OUT/verify-gpu.json" || echo "verify on GPU failed (see $OUT/verify-gpu.json)"
python3 bench/gpu/plugin_evidence.py --out "$OUT" "$@"
