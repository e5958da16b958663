#!/usr/bin/env bash
# GPU machine: run the evidence phases one after another, detached (setsid) so that short `run` calls can
# poll while it works.  Usage:  setsid nohup bash tests/gpu/session.sh PHASE... >/tmp/session.log 2>&1 &
# Phases: smoke, gdn, cold, seeded, warm, gdnbench, aot, tp2.  Results go to /tmp/results (tests/gpu/poll.sh packs them).
set -u
source tests/gpu/bootstrap.sh
R=/tmp/results; mkdir -p $R /tmp/session
ngpu=$(nvidia-smi -L | wc -l)
pair=$([ "$ngpu" -ge 2 ] && echo 0,1 || echo 0,0)
other=$([ "$ngpu" -ge 2 ] && echo 1 || echo 0)
for phase in "$@"; do
  echo "=== $phase start $(date +%T)"
  t0=$(date +%s)
  case $phase in
    smoke)    # 4 layers, eager: the plugin worker, strict warmup, status files, active warmup and sidecar in ~1.5 min
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              timeout 400 python3 tests/gpu/side_by_side.py --model /tmp/demo4 --phase smoke --gpus 0,0 --skip-plain \
                --cache /tmp/tbcache-smoke --out $R --ready-limit 300 --extra=--enforce-eager ;;
    gdn)      CUDA_VISIBLE_DEVICES=$other OUT=$R timeout 600 python3 tests/gpu/gdn_correctness.py > $R/gdn_correctness.txt 2>&1 ;;
    gdnbench) CUDA_VISIBLE_DEVICES=$other OUT=$R timeout 400 python3 tests/gpu/gdn_bench.py > $R/gdn_bench.txt 2>&1 ;;
    cold)     timeout 900 python3 tests/gpu/side_by_side.py --model /tmp/demo --phase cold --gpus $pair \
                --cache /tmp/tbcache --out $R ;;
    seeded)   # the cold run's caches copied to fresh paths: what a new volume seeded elsewhere looks like
              rm -rf /tmp/tbcache-seeded /tmp/tbcache-seeded-plain
              cp -a /tmp/tbcache /tmp/tbcache-seeded; cp -a /tmp/tbcache-plain /tmp/tbcache-seeded-plain
              timeout 900 python3 tests/gpu/side_by_side.py --model /tmp/demo --phase seeded --gpus $pair \
                --cache /tmp/tbcache-seeded --out $R --bench ;;
    warm)     timeout 900 python3 tests/gpu/side_by_side.py --model /tmp/demo --phase warm --gpus $pair \
                --cache /tmp/tbcache-seeded --out $R ;;
    aot)      OUT=$R timeout 300 python3 tests/gpu/cache_aot_check.py > $R/cache_aot_check.txt 2>&1 ;;
    tp2)      timeout 900 python3 tests/gpu/side_by_side.py --model /tmp/demo --phase tp2 --gpus 0,0 --skip-plain \
                --cache /tmp/tbcache-tp2 --out $R --extra="--tensor-parallel-size 2" ;;
    *)        echo "unknown phase $phase" ;;
  esac
  echo "=== $phase done rc=$? in $(( $(date +%s) - t0 )) s"
  touch /tmp/session/$phase.done
done
touch /tmp/session/all.done
