#!/usr/bin/env bash
# `make bench-startup` (GPU host): plain `vllm serve` vs `turingbox serve` on empty, seeded and warm caches.
#
#   bash bench/startup.sh                 # every phase in order: empty seed seeded warm
#   bash bench/startup.sh empty           # one phase per call (each fits a 10-minute window);
#   bash bench/startup.sh seed            # caches and results stay in $BENCH_WORK between calls
#
# Environment: BENCH_MODEL (default /tmp/demo, made with `turingbox demo-model` if missing),
# BENCH_GPUS (default: 0,1 when two GPUs are visible, else 0), BENCH_WORK (/tmp/turingbox-bench),
# BENCH_BUDGET_S per phase (540), OUT (results: $OUT, else docs/img), PYTHON (python3), BENCH_TB_WRAP (a command
# that runs turingbox serve, e.g. a profiler; one string, not split like BENCH_ARGS).
# Results: $OUT/startup.json and $OUT/startup.png; logs in $BENCH_WORK/logs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
MODEL=${BENCH_MODEL:-/tmp/demo}
if [ -z "${BENCH_GPUS:-}" ]; then
  n=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l || echo 1)
  if [ "$n" -ge 2 ]; then BENCH_GPUS=0,1; else BENCH_GPUS=0; fi
fi
[ -d "$MODEL" ] || "$PY" -m turingbox demo-model "$MODEL"
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(empty seed seeded warm)
for phase in "${phases[@]}"; do
  "$PY" bench/startup.py --phase "$phase" --model "$MODEL" --gpus "$BENCH_GPUS" \
    --work "${BENCH_WORK:-/tmp/turingbox-bench}" --out "${OUT:-docs/img}" \
    --budget-s "${BENCH_BUDGET_S:-540}" ${BENCH_TB_WRAP:+"--tb-wrap=$BENCH_TB_WRAP"} ${BENCH_ARGS:-}
done
