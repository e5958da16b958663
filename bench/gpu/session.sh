#!/usr/bin/env bash
# GPU machine: run the evidence phases one after another, detached (setsid) so that short `run` calls can
# poll while it works.  Usage:  setsid nohup bash bench/gpu/session.sh PHASE... >/tmp/session.log 2>&1 &
# Phases, one `case` branch each (tests/bench/gpu/test_session_script.py checks this list against the branches):
#   smoke: 4 layers, eager: the plugin worker, strict warmup, status files, active warmup and sidecar
#   gdn, gdnbench: the sm_75 GDN kernels' correctness and microbenchmarks
#   cold, seeded, warm: TP=1 pairs with plain vLLM on two GPUs
#   aot: kernels compiled ahead of time load without compiling (bench/gpu/cache_aot_check.py)
#   tp2, tp2cold, tp2seeded, tp2warm, tp2baked: the TP=2 series on both GPUs (tp2cold: + real clients, interleaved
#     proxy latency)
#   tp4cold, tp4seeded, tp4mtp3: four GPUs (issue 7)
#   seedonly: warmup --seed-only, then clients starts from a copy
#   clients: 4-layer demo: openai client, JIT check, proxy latency, benches
#   turbo, turbo-ref: the same demo with TURINGBOX_GDN=turbo / vllm, cold, benches
#   tools: the plugin's doctor, verify and check-model on a GPU
#   greedy, greedy-vllm, greedy-turbo, greedy-compare: turbo vs vLLM GDN tokens end to end (both modes, one each,
#     the comparison)
#   bisect: which soak request killed vLLM's engine (bench/gpu/crash_bisect.py)
#   mintokens: session 22's engine crash (min_tokens vs a finished structured output, MTP) and the plugin's fix
#   soakseed, soak64, soakawq: issue 15's traffic soak (bench/gpu/soak.py; SOAK_S, SOAK_MIN_REQ, SOAK_MAX_S,
#     SOAK_SEED, SOAK_PEER below)
#   replay8: session 8's soak replayed against the fixed plugin, beside soakawq
#   replaysoak: a committed soak record (SOAK_RECORD) replayed against plain vLLM alone
#   fixcheck: session 24's fixes on real vLLM, 4-layer demo: prompt_logprobs_check.py and a soak record's refusals and
#     errors (FIX_RECORD) against turingbox serve, then against plain vLLM on a copy of its caches
#   hostile: issue 37's hostile request (bench/gpu/hostile.py) against turingbox serve on startup's seeded entry
#   fibaked: issue 20, beside soak64
#   ckptwrite, ckptload: issue 35's real-size checkpoint (bench/checkpoint_load.py): the AWQ demo's shards written
#     (ckptwrite, may run beside a phase whose seconds are not measured), then the disk's read speed and vLLM's load
#     formats against it (ckptload, CKPT_FORMATS; alone on the machine)
#   startup: issue 18's A/B, bench/startup.sh; STARTUP_STEPS names its steps
#   coldab: issue 35 item 4, startup's steps for the cold A/B in one run: turingbox on empty caches with the image's
#     FlashInfer module, plain vLLM's empty start with FlashInfer's prebuilt modules (flashinfer-jit-cache's route) and
#     as installed (both staged by bench/gpu/stage-extras.sh in /tmp/dw/fi-aot)
#   kvcut: issue 35's --kv-cache-memory-bytes from the seed: seeded starts with and without it (startup's steps)
#   plmem: prompt_logprobs memory on startup's caches
#   startupx: turingbox warm under py-spy; STARTUP_NOACTIVE=1 adds one without the active warmup, STARTUP_SPAWN=1 a
#     spawned one
# Two lanes at once (one GPU each): LANE=a bash session.sh ... & LANE=b bash session.sh ... ; each lane touches
# /tmp/session/$LANE.done at its end (poll.sh 500 a,b waits for both); LANE_GPU picks the lane's GPU.  Results go to /tmp/results (bench/gpu/poll.sh packs them).
set -u
mkdir -p /tmp/session
# Markers left by an earlier session on this (still warm) machine would end poll.sh's wait at once.
for phase in "$@"; do rm -f "/tmp/session/$phase.done" "/tmp/session/$phase.serving" "/tmp/session/$phase.plain-serving"; done
rm -f "/tmp/session/${LANE:-all}.done" /tmp/session/all.done
# The lane's marker is written however this script ends (a failed bootstrap included), so poll.sh never
# waits out its whole limit for a lane that is gone.
trap 'touch "/tmp/session/${LANE:-all}.done"' EXIT
source bench/gpu/bootstrap.sh
set +e   # a failing phase is logged with its rc; the next phase still runs
R=/tmp/results; mkdir -p $R
ngpu=$(nvidia-smi -L | wc -l)
pair=$([ "$ngpu" -ge 2 ] && echo 0,1 || echo 0,0)
other=$([ "$ngpu" -ge 2 ] && echo 1 || echo 0)
one=${LANE_GPU:-$other}     # the GPU of the one-GPU phases (gdn, gdnbench, tools, greedy, clients) in this lane
# Traffic soak (issue 15; soakseed, soak64, soakawq): bench/gpu/soak.py's knobs, read by the --after hooks too.
# SOAK_PEER names the phase of the other lane sharing this GPU (soak_gate.sh: starts and stops take turns).
# SOAK_WORKERS: client loops drawing groups (more offer more load; the semaphore keeps 32 in flight at most; 0: one per
# sequence slot of the plan, at least 3);
# REPLAY_ARGS: soak.py --replay's sample size and concurrency against plain vLLM.
# IMPORT_PROFILE=1: soak64's two starts with -X importtime (bench/import_profile.py; ~14,000 lines per log).
# SOAK_UTIL: the soak's GPU share (empty: the plan's own, issue 37's soak at the plan's defaults; session 8 ran 0.55
# beside a second lane).
export SOAK_S=${SOAK_S:-600} SOAK_MIN_REQ=${SOAK_MIN_REQ:-2000} SOAK_MAX_S=${SOAK_MAX_S:-1500} SOAK_SEED=${SOAK_SEED:-15} \
  SOAK_GATE_S=${SOAK_GATE_S:-900} SOAK_PEER=${SOAK_PEER:-} SOAK_WORKERS=${SOAK_WORKERS:-0} \
  REPLAY_ARGS=${REPLAY_ARGS:-"--sample 200 --replay-concurrency 4"}
soak_args='--seed $SOAK_SEED --duration $SOAK_S --min-requests $SOAK_MIN_REQ --max-duration $SOAK_MAX_S --workers $SOAK_WORKERS --out $OUT'
soak_gate() { [ -z "$SOAK_PEER" ] || echo "bash bench/gpu/soak_gate.sh $SOAK_PEER $1 $SOAK_GATE_S >> \$OUT/soak-gates.txt 2>&1"; }
# After each soak: the GPU memory each process holds (gpu-memory-TAG.txt), against the plan's budget (session 10: an
# engine 7.6 GiB over its budget after a prompt_logprobs request, fixed since in the plugin).
gpu_memory() { echo "nvidia-smi --query-compute-apps=pid,used_memory --format=csv > \$OUT/gpu-memory-$1.txt 2>&1"; }
soak_limit=$(( SOAK_MAX_S + 2 * SOAK_GATE_S + 2400 ))
# Plain vLLM's cache root made from a turingbox cache root's entry (its vllm/, triton/, inductor/; empty without one)
entry_as_plain_cache() { local key; mkdir -p "$2"; key=$(ls "$1/entries" 2>/dev/null | head -1)
  [ -z "$key" ] || cp -a "$1/entries/$key/." "$2/"; }
export -f entry_as_plain_cache    # side_by_side.py's hooks (bash -c) call it too
# Issue 18's bench steps (startup, startupx): $1 phase, $2 bench flags; BENCH_TB_WRAP passes through the environment.
startup_step() {
  echo "--- $1 $2 $(date +%T)" >> $R/startup.txt
  OUT=$R/startup BENCH_GPUS=$one BENCH_WORK=/tmp/turingbox-bench \
    BENCH_ARGS="--tb-env TURINGBOX_AOT_MODELINFOS_DIR=/tmp/tb-modelinfos --copy-logs $2" \
    timeout 600 bash bench/startup.sh "$1" >> $R/startup.txt 2>&1; }
# STARTUP_DUMPS=N: every N s while the startup steps run, a nonblocking py-spy dump of each vLLM engine core (what a
# start does in the minutes its log is silent; py-spy from the staged wheels). Results: $R/startup/pyspy-dumps.txt
pyspy_dumps() {
  local bin; bin=$(ls /tmp/site/bin/py-spy /tmp/pyspy/bin/py-spy 2>/dev/null | head -1)
  [ -n "$bin" ] || { echo "py-spy is not staged: no dumps" >> $R/startup.txt; return 0; }
  while [ ! -e /tmp/session/dumps.stop ]; do
    sleep "$1"
    for pid in $(pgrep -f EngineCore); do
      echo "=== $(date +%T) pid $pid"; timeout 20 "$bin" dump --pid "$pid" --nonblocking 2>&1 | head -80
    done
  done >> $R/startup/pyspy-dumps.txt 2>&1; }
# The image's model infos (Dockerfile: turingbox_warmup.image.modelinfos), built once per machine: new entries start with them,
# so vLLM skips its model-class inspections (startup steps' --tb-env, soakawq's --env)
build_modelinfos_once() {
  [ -d /tmp/tb-modelinfos/modelinfos ] || python3 -m turingbox_warmup.image.modelinfos --out /tmp/tb-modelinfos \
    > $R/modelinfos.txt 2>&1; }
# What the image gives every new cache entry (Dockerfile ENV), for the phases that start turingbox cold outside the
# startup bench: vLLM's model infos, and FlashInfer's sampling module when bench/gpu/stage-extras.sh staged it. One
# KEY=VALUE per line (`env $(image_env) ...`, or `--env` each for side_by_side.py).
FI_AOT=/tmp/dw/fi-aot     # FlashInfer's modules as stage-extras.sh builds them (the image's /opt/turingbox/flashinfer-aot)
image_env() {
  build_modelinfos_once; echo "TURINGBOX_AOT_MODELINFOS_DIR=/tmp/tb-modelinfos"
  [ ! -d $FI_AOT/.cache/flashinfer ] || echo "TURINGBOX_AOT_FLASHINFER_DIR=$FI_AOT"; }
for phase in "$@"; do
  echo "=== $phase start $(date +%T)"
  t0=$(date +%s)
  case $phase in
    smoke)    # 4 layers, eager: the plugin worker, strict warmup, status files, active warmup and sidecar in ~1.5 min
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              timeout 400 python3 bench/gpu/side_by_side.py --model /tmp/demo4 --phase smoke --gpus 0,0 --skip-plain \
                --cache /tmp/tbcache-smoke --out $R --ready-limit 300 --extra=--enforce-eager ;;
    gdn)      CUDA_VISIBLE_DEVICES=$one OUT=$R timeout 600 python3 bench/gpu/gdn_correctness.py > $R/gdn_correctness.txt 2>&1 ;;
    gdnbench) CUDA_VISIBLE_DEVICES=$one OUT=$R timeout 400 python3 bench/gpu/gdn_bench.py > $R/gdn_bench.txt 2>&1 ;;
    cold)     timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase cold --gpus $pair \
                --cache /tmp/tbcache --out $R ;;
    seeded)   # the cold run's caches copied to fresh paths: what a new volume seeded elsewhere looks like
              rm -rf /tmp/tbcache-seeded /tmp/tbcache-seeded-plain
              cp -a /tmp/tbcache /tmp/tbcache-seeded; cp -a /tmp/tbcache-plain /tmp/tbcache-seeded-plain
              timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase seeded --gpus $pair \
                --cache /tmp/tbcache-seeded --out $R --bench ;;
    warm)     timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase warm --gpus $pair \
                --cache /tmp/tbcache-seeded --out $R ;;
    aot)      OUT=$R timeout 300 python3 bench/gpu/cache_aot_check.py > $R/cache_aot_check.txt 2>&1 ;;
    tp2)      timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp2 --gpus 0,0 --skip-plain \
                --cache /tmp/tbcache-tp2 --out $R --extra="--tensor-parallel-size 2" ;;
    tp2cold)  # empty caches; then, while it serves: the openai client, `vllm bench serve` and the interleaved proxy latency
              timeout 1200 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp2cold --gpus 0,0 --skip-plain \
                --cache /tmp/tbc2 --out $R --ready-limit 900 --env CUDA_VISIBLE_DEVICES=0,1 \
                --after='python3 bench/gpu/real_clients.py > $OUT/real_clients.txt 2>&1; python3 tests/reliability/latency_bench.py --direct-port $DIRECT_PORT --proxy-port $PROXY_PORT --model $MODEL --requests 100 --json $OUT/proxy-latency.json > $OUT/proxy-latency.txt 2>&1' ;;
    tp2seeded) # a fresh copy of the cold run's cache volume: what a volume seeded elsewhere looks like
              rm -rf /tmp/tbc2-seeded; cp -a /tmp/tbc2 /tmp/tbc2-seeded
              timeout 600 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp2seeded --gpus 0,0 --skip-plain \
                --cache /tmp/tbc2-seeded --out $R --env CUDA_VISIBLE_DEVICES=0,1 --no-decode ;;
    tp2warm)  # all warm: the cold run's own volume, third start of this plan
              timeout 600 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp2warm --gpus 0,0 --skip-plain \
                --cache /tmp/tbc2 --out $R --env CUDA_VISIBLE_DEVICES=0,1 --no-decode ;;
    tp2baked) # the entry laid out as `make bake` puts it in an image (read-only, 0444/0555) and an empty volume
              rm -rf /tmp/baked /tmp/tbc2-frombaked; mkdir -p /tmp/baked/entries /tmp/tbc2-frombaked
              key=$(ls /tmp/tbc2/entries | head -1); cp -a /tmp/tbc2/entries/$key /tmp/baked/entries/$key
              find /tmp/baked -type f -exec chmod 0444 {} +; find /tmp/baked -type d -exec chmod 0555 {} +
              timeout 600 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp2baked --gpus 0,0 --skip-plain \
                --cache /tmp/tbc2-frombaked --out $R --env CUDA_VISIBLE_DEVICES=0,1 --env TURINGBOX_BAKED_CACHE_DIR=/tmp/baked \
                --no-decode ;;
    tp4cold)  # issue 7 (nvidia-h200-x4): TP=4 with the sm_75 MTP rule forced (TURINGBOX_MTP=4), empty caches, benches
              timeout 1500 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp4cold --gpus 0,0 --skip-plain \
                --cache /tmp/tbc4 --out $R --ready-limit 1200 --env CUDA_VISIBLE_DEVICES=0,1,2,3 --env TURINGBOX_MTP=4 --bench ;;
    tp4seeded) rm -rf /tmp/tbc4-seeded; cp -a /tmp/tbc4 /tmp/tbc4-seeded
              timeout 600 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp4seeded --gpus 0,0 --skip-plain \
                --cache /tmp/tbc4-seeded --out $R --env CUDA_VISIBLE_DEVICES=0,1,2,3 --env TURINGBOX_MTP=4 --no-decode ;;
    tp4mtp3)  # the same TP=4 plan at MTP=3 (another cache key: MTP depth is in the fingerprint), benches for 3 vs 4
              timeout 1500 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase tp4mtp3 --gpus 0,0 --skip-plain \
                --cache /tmp/tbc4 --out $R --ready-limit 1200 --env CUDA_VISIBLE_DEVICES=0,1,2,3 --env TURINGBOX_MTP=3 --bench ;;
    seedonly) # issue 5's seeding path: `turingbox warmup --seed-only` fills an entry in its own process and stops; the
              # clients phase then starts from a fresh copy of it
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              rm -rf /tmp/tbcache-seedonly /tmp/tbcache-clients
              CUDA_VISIBLE_DEVICES=$one timeout 900 python3 -m turingbox warmup --seed-only --model /tmp/demo4 \
                --cache-dir /tmp/tbcache-seedonly > $R/warmup-seedonly.log 2>&1
              echo "warmup --seed-only exit $?" >> $R/warmup-seedonly.log
              python3 -m turingbox cache show --cache-dir /tmp/tbcache-seedonly >> $R/warmup-seedonly.log 2>&1
              # no entry (warmup failed before creating the root): clients then starts from an empty cache
              [ -d /tmp/tbcache-seedonly ] && cp -a /tmp/tbcache-seedonly /tmp/tbcache-clients ;;
    clients)  # the openai client (tool calls: structured output, then the JIT counters) and the interleaved proxy latency,
              # on the 4-layer demo with CUDA graphs like the appliance
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo4 --phase clients --gpus $one,$one --skip-plain \
                --cache /tmp/tbcache-clients --out $R --no-decode --bench --ready-limit 800 \
                --after='SKIP_BENCH_SERVE=1 REAL_CLIENTS_JSON=real_clients-demo4.json python3 bench/gpu/real_clients.py > $OUT/real_clients-demo4.txt 2>&1; python3 tests/reliability/latency_bench.py --direct-port $DIRECT_PORT --proxy-port $PROXY_PORT --model $MODEL --requests 100 --json $OUT/proxy-latency.json > $OUT/proxy-latency.txt 2>&1' ;;
    turbo)    # issue 6 end to end: the same 4-layer demo with the turbo GDN path forced (vs clients' vLLM kernels, both
              # --bench); other ports, so that it may run while the other lane serves
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo4 --phase turbo --gpus $one,$one --skip-plain \
                --cache /tmp/tbcache-turbo --out $R --bench --ready-limit 800 --port-offset 10 --env TURINGBOX_GDN=turbo ;;
    turbo-ref) # turbo's reference: the same plan with vLLM's own GDN kernels, started cold at the same time
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/demo4 --phase turbo-ref --gpus $one,$one --skip-plain \
                --cache /tmp/tbcache-turboref --out $R --bench --ready-limit 800 --port-offset 20 --env TURINGBOX_GDN=vllm ;;
    tools)    # the plugin's own tools on a GPU: doctor, verify (kernels vs references), check-model
              for t in "doctor /tmp/demo" "verify --json" "check-model /tmp/demo"; do
                echo "\$ turingbox $t"; CUDA_VISIBLE_DEVICES=$one timeout 300 python3 -m turingbox $t; echo "exit $?"
              done > $R/tools.txt 2>&1 ;;
    greedy|greedy-vllm|greedy-turbo)
              # greedy runs both modes here; greedy-vllm / greedy-turbo run one each (one per lane), greedy-compare
              # compares whatever both have written. vllm first: it pays the FLA autotune on a cold Triton cache.
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              modes=$([ $phase = greedy ] && echo "vllm turbo" || echo "${phase#greedy-}")
              for m in $modes; do
                CUDA_VISIBLE_DEVICES=$one timeout $([ $m = vllm ] && echo 600 || echo 450) python3 bench/gpu/gdn_e2e_greedy.py \
                  run --mode $m --model /tmp/demo4 --out $R/greedy-$m.json > $R/greedy-$m.log 2>&1
                echo "greedy $m exit $?" >> $R/greedy-$m.log
              done
              [ $phase = greedy ] && python3 bench/gpu/gdn_e2e_greedy.py compare $R/greedy-vllm.json $R/greedy-turbo.json \
                --json $R/greedy-compare.json > $R/greedy-compare.txt 2>&1 ;;
    greedy-compare)
              python3 bench/gpu/gdn_e2e_greedy.py compare $R/greedy-vllm.json $R/greedy-turbo.json \
                --json $R/greedy-compare.json > $R/greedy-compare.txt 2>&1 ;;
    bisect)   # issue 15: which soak request killed vLLM's engine (bench/gpu/crash_bisect.py): plain vLLM (BISECT_MODE=
              # turingbox: turingbox serve) with the plan's argv on the 4-layer demo at 0.25 of the GPU; its restarts
              # wait for the soakseed lane's KV sizing (one GPU: vLLM's memory profile is device-wide)
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              CUDA_VISIBLE_DEVICES=$one TURINGBOX_GPU_MEMORY_UTILIZATION=0.25 TURINGBOX_MAX_NUM_SEQS=16 \
                TURINGBOX_MAX_MODEL_LEN=262144 python3 -m turingbox plan --model /tmp/demo4 --json > $R/plan-bisect.json
              CUDA_VISIBLE_DEVICES=$one TURINGBOX_GPU_MEMORY_UTILIZATION=0.25 TURINGBOX_MAX_NUM_SEQS=16 \
                TURINGBOX_MAX_MODEL_LEN=262144 OUT=$R timeout 1500 python3 bench/gpu/crash_bisect.py \
                --plan $R/plan-bisect.json --candidates ${BISECT_CANDIDATES:-bench/gpu/crash_candidates.json} \
                --mode ${BISECT_MODE:-plain} --gate-log $R/warmup-soakseed.log --gate-done /tmp/session/soakseed.done \
                --serving-marker /tmp/session/bisect.serving > $R/crash-bisect-${BISECT_MODE:-plain}.txt 2>&1 ;;
    mintokens) # session 22's soak crash: min_tokens against a structured output that can only end (the grammar
              # permits only <|im_end|>, min_tokens masks it; under MTP the all -inf row killed the 64-layer engine).
              # 4-layer demo, eager: turingbox serve (the plugin's fix_min_tokens_vs_grammar and fix_out_of_vocab_ids)
              # gets all the candidates, one by one and together (the last, allowed_token_ids [90] "{" with a
              # json_object, empties its row at the second token without min_tokens: session 27 a 500, since then
              # fix_allowed_ids_dead_end's 400); then plain vLLM with the plan's
              # argv, on a copy of turingbox's entry (its cold start took 219 s in session 25, the copy saves most of
              # it), gets the first alone (session 25: a 500 "Internal server error", the engine alive)
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              export TURINGBOX_ENFORCE_EAGER=1 TURINGBOX_GPU_MEMORY_UTILIZATION=0.5
              # turingbox starts as the image starts it (its model infos and, when staged, FlashInfer's module): the
              # cold start is most of this phase's device time (292 s in session 27 without them)
              mt_env=$(image_env); echo "image env: $mt_env" > $R/mintokens-image-env.txt
              env CUDA_VISIBLE_DEVICES=$one $mt_env python3 -m turingbox plan --model /tmp/demo4 --json > $R/plan-mintokens.json
              python3 -c "import json; json.dump(json.load(open('bench/gpu/min_tokens_candidates.json'))[:1], open('/tmp/mintokens-plain.json', 'w'))"
              rm -rf /tmp/mt-tb /tmp/mt-plain
              env CUDA_VISIBLE_DEVICES=$one OUT=$R $mt_env timeout 660 python3 bench/gpu/crash_bisect.py --plan $R/plan-mintokens.json \
                --candidates bench/gpu/min_tokens_candidates.json --mode turingbox --repeat 1 --port 8400 \
                --cache /tmp/mt-tb --ready-limit 540 > $R/mintokens-turingbox.txt 2>&1
              # MINTOKENS_PLAIN=0: turingbox's side only (plain's 500 is on record from sessions 25 and 27)
              if [ "${MINTOKENS_PLAIN:-1}" != 0 ]; then
              entry_as_plain_cache /tmp/mt-tb /tmp/mt-plain
              CUDA_VISIBLE_DEVICES=$one OUT=$R timeout 660 python3 bench/gpu/crash_bisect.py --plan $R/plan-mintokens.json \
                --candidates /tmp/mintokens-plain.json --mode plain --repeat 0 --no-restart --port 8300 --cache /tmp/mt-plain \
                --ready-limit 540 > $R/mintokens-plain.txt 2>&1
              fi
              unset TURINGBOX_ENFORCE_EAGER TURINGBOX_GPU_MEMORY_UTILIZATION ;;
    soakseed) # issue 15: the 64-layer demo's entry at the soak's memory share, filled cold by `warmup --seed-only`
              [ -d /tmp/demo ] || python3 -m turingbox demo-model /tmp/demo
              # SEED_AFTER=bisect: start only once the other lane's server has sized its KV cache
              [ -z "${SEED_AFTER:-}" ] || bash bench/gpu/soak_gate.sh $SEED_AFTER serving 600 >> $R/soak-gates.txt 2>&1
              rm -rf /tmp/tbsoak
              seed_env=$(image_env); echo "image env: $seed_env" > $R/soakseed-image-env.txt
              env CUDA_VISIBLE_DEVICES=$one $seed_env ${SOAK_UTIL:+TURINGBOX_GPU_MEMORY_UTILIZATION=$SOAK_UTIL} timeout 900 \
                python3 -m turingbox warmup --seed-only --model /tmp/demo --cache-dir /tmp/tbsoak > $R/warmup-soakseed.log 2>&1
              echo "warmup --seed-only exit $?" >> $R/warmup-soakseed.log
              python3 -m turingbox cache show --cache-dir /tmp/tbsoak >> $R/warmup-soakseed.log 2>&1 ;;
    soak64)   # issue 15: turingbox from a fresh copy of soakseed's entry: first request vs next ten (side_by_side),
              # the traffic soak, then plain `vllm serve` with the plan's argv (minus worker/plugin), on a copy of
              # the same entry's caches, and the soak's 4xx + 200 others replayed against it
              # SOAK_HOSTILE=1: issue 37's hostile request first, on the same server (saves a start: bench/gpu/hostile.py);
              # SOAK_PLAIN=0: no plain vLLM here (its replay in a later session: replaysoak, from the committed record)
              soak_hostile=""; [ "${SOAK_HOSTILE:-0}" = 1 ] && soak_hostile="timeout 300 python3 bench/gpu/hostile.py --url http://127.0.0.1:\$PROXY_PORT --out \$OUT/hostile-soak64.json > \$OUT/hostile-soak64.txt 2>&1; "
              # SOAK_PLP=1: prompt logprobs of graph-sized vs eager steps first (the plugin's fix for vllm#53488, ~1 min)
              [ "${SOAK_PLP:-0}" = 1 ] && soak_hostile+="timeout 300 python3 bench/gpu/prompt_logprobs_check.py --url http://127.0.0.1:\$PROXY_PORT --out \$OUT/plp-check-soak64.json > \$OUT/plp-check-soak64.txt 2>&1; "
              # with SOAK_PLP=1 plain vLLM gets the same check first: its side of the before/after
              plain_plp=""; [ "${SOAK_PLP:-0}" = 1 ] && plain_plp='timeout 300 python3 bench/gpu/prompt_logprobs_check.py --url http://127.0.0.1:$PLAIN_PORT --out $OUT/plp-check-plain-soak64.json > $OUT/plp-check-plain-soak64.txt 2>&1; '
              soak_after=(--after="touch /tmp/session/soak64.plain-serving; ${plain_plp}"'python3 bench/gpu/soak.py --replay $OUT/soak-soak64.jsonl --url http://127.0.0.1:$PLAIN_PORT $REPLAY_ARGS --out $OUT > $OUT/replay-soak64.txt 2>&1')
              [ "${SOAK_PLAIN:-1}" = 0 ] && soak_after=(--skip-plain)
              # SOAK_CACHES=empty: no soakseed before it; turingbox serves from empty caches (a cold start, its strict
              # warmup compiling everything): the soak when the session's device time cannot also hold the seed
              rm -rf /tmp/tbsoak-seeded /tmp/tbsoak-plain
              soak_env=(); plain_caches=""
              if [ "${SOAK_CACHES:-seeded}" = empty ]; then echo "soak64: empty caches (no soakseed)" | tee $R/soak64-caches.txt
                for kv in $(image_env); do soak_env+=(--env "$kv"); done; echo "image env: ${soak_env[*]}" >> $R/soak64-caches.txt
                # plain vLLM starts on a copy of the entry the cold serve filled, made once the soak is done (as fixcheck
                # does): a loading start (~3 min on an H200, session 17) instead of a second cold one (~6.5-8 min), so
                # the soak and its replay fit one session's device time
                plain_caches='entry_as_plain_cache /tmp/tbsoak-seeded /tmp/tbsoak-plain; echo "plain caches: a copy of the cold serve entry" >> $OUT/soak64-caches.txt; '
              else cp -a /tmp/tbsoak /tmp/tbsoak-seeded; echo "soak64: a copy of soakseed's entry" > $R/soak64-caches.txt
                entry_as_plain_cache /tmp/tbsoak /tmp/tbsoak-plain; fi
              timeout $soak_limit python3 bench/gpu/side_by_side.py --model /tmp/demo --phase soak64 --gpus $one,$one \
                --cache /tmp/tbsoak-seeded --plain-cache /tmp/tbsoak-plain --out $R --no-decode --ready-limit 900 \
                ${SOAK_UTIL:+--env TURINGBOX_GPU_MEMORY_UTILIZATION=$SOAK_UTIL} "${soak_env[@]}" "${soak_after[@]}" \
                --after-timeout $(( SOAK_MAX_S + SOAK_GATE_S + 600 )) \
                ${IMPORT_PROFILE:+--env PYTHONPROFILEIMPORTTIME=1 --plain-env PYTHONPROFILEIMPORTTIME=1} \
                --tb-after="touch /tmp/session/soak64.serving; ${soak_hostile}python3 -m turingbox bench decode --url http://127.0.0.1:\$PROXY_PORT --repeats 3 --max-tokens 256 --json --output \$OUT/bench-decode-soak64.json > \$OUT/bench-decode-soak64.txt 2>&1; curl -s http://127.0.0.1:\$DIRECT_PORT/metrics > \$OUT/vllm-metrics-soak64-before.txt; curl -s http://127.0.0.1:\$PROXY_PORT/metrics > \$OUT/public-metrics-soak64-before.txt; (for i in 1 2 3 4 5; do sleep 110; curl -s -m 20 http://127.0.0.1:\$PROXY_PORT/metrics > \$OUT/public-metrics-soak64-mid\$i.txt; done) > /dev/null 2>&1 & python3 bench/gpu/soak.py --url http://127.0.0.1:\$PROXY_PORT $soak_args --tag soak64 > \$OUT/soak-soak64.txt 2>&1; $(gpu_memory soak64); curl -s http://127.0.0.1:\$DIRECT_PORT/metrics > \$OUT/vllm-metrics-soak64-after.txt; curl -s http://127.0.0.1:\$PROXY_PORT/metrics > \$OUT/public-metrics-soak64-after.txt; python3 -m turingbox jit-report --url http://127.0.0.1:\$PROXY_PORT --output \$OUT/jit-report-soak64.json > \$OUT/jit-report-soak64.txt 2>&1; ${plain_caches}$(soak_gate serving)"
              touch /tmp/session/soak64.plain-serving
              python3 bench/gpu/soak.py --verdict --tag soak64 --out $R --log turingbox-soak64.log --log plain-soak64.log \
                > $R/verdict-soak64.txt 2>&1 ;;
    replaysoak) # issue 37: a committed soak record (SOAK_RECORD=docs/data/...: soak-soak64.jsonl.gz) replayed against
              # plain `vllm serve` alone, started on empty caches with the plan's argv (minus worker/plugin) at the soak's
              # share: every 4xx and refusal + REPLAY_ARGS' sample of the rest; its start is plain's empty start (#35's cold A/B);
              # first prompt_logprobs_check.py, plain vLLM's side of the vllm#53488 check (SOAK_PLP is turingbox's)
              mkdir -p /tmp/replaysoak; zcat "$SOAK_RECORD/soak-soak64.jsonl.gz" > /tmp/replaysoak/soak-soak64.jsonl
              cp "$SOAK_RECORD/soak-soak64.json" /tmp/replaysoak/ 2>/dev/null
              [ -d /tmp/demo ] || python3 -m turingbox demo-model /tmp/demo
              rm -rf /tmp/tbreplay-plain
              timeout 1500 python3 bench/gpu/side_by_side.py --model /tmp/demo --phase replaysoak --gpus $one,$one \
                --skip-turingbox --plain-cache /tmp/tbreplay-plain --out $R --no-decode --ready-limit 900 \
                ${SOAK_UTIL:+--env TURINGBOX_GPU_MEMORY_UTILIZATION=$SOAK_UTIL} --after-timeout 840 \
                --after="timeout 300 python3 bench/gpu/prompt_logprobs_check.py --url http://127.0.0.1:\$PLAIN_PORT --out \$OUT/plp-check-replaysoak.json > \$OUT/plp-check-replaysoak.txt 2>&1; python3 bench/gpu/soak.py --replay /tmp/replaysoak/soak-soak64.jsonl --url http://127.0.0.1:\$PLAIN_PORT $REPLAY_ARGS --tag replaysoak --out \$OUT > \$OUT/replay-replaysoak.txt 2>&1" ;;
    fixcheck) # session 24's fixes where a 64-layer soak does not fit the device time: the 4-layer demo with CUDA graphs and
              # MTP, max_num_seqs 2 as in the soak (the same admission limits). turingbox serve (cold), then plain vLLM on a
              # copy of its entry; each gets prompt_logprobs_check.py (vllm#53488) and the replay of FIX_RECORD's 4xx and
              # in-stream errors (--sample 0: its stream refusals, NaN 400s and admission refusals)
              [ -d /tmp/demo4 ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
              mkdir -p /tmp/fixcheck; rm -rf /tmp/tbfix /tmp/tbfix-plain
              zcat "${FIX_RECORD:-docs/data/2026-12-06-h100-s23}/soak-soak64.jsonl.gz" > /tmp/fixcheck/soak-fix.jsonl
              cp "${FIX_RECORD:-docs/data/2026-12-06-h100-s23}/soak-soak64.json" /tmp/fixcheck/soak-fix.json
              fix_checks() { echo "timeout 300 python3 bench/gpu/prompt_logprobs_check.py --url http://127.0.0.1:\$$1 --out \$OUT/plp-check-fix-$2.json > \$OUT/plp-check-fix-$2.txt 2>&1; timeout 420 python3 bench/gpu/soak.py --replay /tmp/fixcheck/soak-fix.jsonl --sample 0 --replay-concurrency 8 --url http://127.0.0.1:\$$1 --tag fix-$2 --out \$OUT > \$OUT/replay-fix-$2.txt 2>&1"; }
              timeout 1500 python3 bench/gpu/side_by_side.py --model /tmp/demo4 --phase fixcheck --gpus $one,$one \
                --cache /tmp/tbfix --plain-cache /tmp/tbfix-plain --out $R --no-decode --ready-limit 600 \
                --env TURINGBOX_MAX_NUM_SEQS=2 --after-timeout 800 \
                --tb-after="$(fix_checks PROXY_PORT turingbox); python3 -m turingbox jit-report --url http://127.0.0.1:\$PROXY_PORT --output \$OUT/jit-report-fix.json > /dev/null 2>&1; mkdir -p /tmp/tbfix-plain; cp -a /tmp/tbfix/entries/\$(ls /tmp/tbfix/entries | head -1)/. /tmp/tbfix-plain/" \
                --after="$(fix_checks PLAIN_PORT plain)" ;;
    hostile)  # issue 37: turingbox serve again on the A/B's seeded entry (after the startup phase), then one hostile request
              # (n=1000, no max_tokens) among 4 streaming clients: refused with 400, their TTFT within 1.2x unloaded
              [ -d /tmp/turingbox-bench/tb-seeded-root ] || echo "hostile: no seeded entry, turingbox started cold" > $R/hostile-caches.txt
              build_modelinfos_once
              rm -rf /tmp/tb-hostile-home /tmp/tb-hostile-rt; mkdir -p /tmp/tb-hostile-home
              (HOME=/tmp/tb-hostile-home CUDA_VISIBLE_DEVICES=$one TURINGBOX_CACHE_DIR=/tmp/turingbox-bench/tb-seeded-root \
                TURINGBOX_RUNTIME_DIR=/tmp/tb-hostile-rt TURINGBOX_MODEL=/tmp/demo TURINGBOX_AOT_MODELINFOS_DIR=/tmp/tb-modelinfos \
                setsid python3 -m turingbox serve --host 127.0.0.1 --port 8090 > $R/hostile-serve.log 2>&1 & echo $! > /tmp/hostile.pid)
              # HOSTILE_READY_S: how long to wait for ready (300 s: a warm start; a machine without startup's entry
              # starts cold, ~450-600 s)
              for _ in $(seq 1 $(( ${HOSTILE_READY_S:-300} / 2 ))); do curl -sf -o /dev/null http://127.0.0.1:8090/health/ready && break; sleep 2; done   # poll
              timeout 300 python3 bench/gpu/hostile.py --url http://127.0.0.1:8090 --out $R/hostile.json > $R/hostile.txt 2>&1
              kill -TERM "$(cat /tmp/hostile.pid)"; for _ in $(seq 1 30); do kill -0 "$(cat /tmp/hostile.pid)" 2>/dev/null || break; sleep 1; done ;;
    startup|coldab)  # issue 18's A/B (bench/startup.sh), one server at a time on one GPU: STARTUP_STEPS lists its steps as
              # "phase|flags" separated by ';'. The default is the whole A/B in one go (~18 min: plain vLLM's empty start fills
              # its caches, turingbox's seed its entry, then both seeded); session 15 ran it in calls of under 10 minutes
              # each (bench/gpu/README.md): "seed|", then "seeded|--only turingbox;empty|--only plain", then "seeded|--only
              # plain". The caches stay in /tmp/turingbox-bench between calls; a report ends each. BENCH_MODEL picks another
              # model (made with BENCH_LAYERS layers when missing). Results: $R/startup
              build_modelinfos_once
              [ -z "${BENCH_MODEL:-}" ] || [ -d "$BENCH_MODEL" ] || python3 -m turingbox demo-model "$BENCH_MODEL" \
                --layers "${BENCH_LAYERS:-4}" > $R/demo-model.txt 2>&1
              default_steps="empty|--only plain;seed|;seeded|"
              if [ "$phase" = coldab ]; then   # ~190 + ~290 + ~380 s on an H100 (estimates from sessions 17, 27, 28)
                default_steps="empty|--only turingbox --label imageaot --tb-env TURINGBOX_AOT_FLASHINFER_DIR=$FI_AOT;empty|--only plain --label jitcache --plain-flashinfer-prebuilt $FI_AOT;empty|--only plain"
                # the first start must not be the only one to read the installed packages from disk
                find /tmp/site -type f -print0 | xargs -0 cat > /dev/null 2>&1
              fi
              IFS=';' read -ra steps <<< "${STARTUP_STEPS:-$default_steps}"
              if [ "$phase" = coldab ] && [ ! -d $FI_AOT/.cache/flashinfer ]; then
                echo "coldab: $FI_AOT is not staged (bench/gpu/stage-extras.sh); without it every cold start pays" \
                  "FlashInfer's nvcc: not run" >> $R/startup.txt; steps=()
              fi
              mkdir -p $R/startup; rm -f /tmp/session/dumps.stop
              [ "${STARTUP_DUMPS:-0}" = 0 ] || pyspy_dumps "$STARTUP_DUMPS" &
              for step in "${steps[@]}" "report|"; do
                startup_step "${step%%|*}" "${step#*|}"
              done
              touch /tmp/session/dumps.stop
              # vLLM's own record of what its compile key hashed, per start (session 11: HOME moved it)
              find /tmp/turingbox-bench -name cache_key_factors.json -path '*backbone*' | while read -r f; do
                echo "== $f"; cat "$f"; done > $R/startup/cache-key-factors.txt 2>&1
              # what each empty start compiled, and when (the cold start's silent minutes)
              for root in tb-empty-root plain-home; do
                [ -d /tmp/turingbox-bench/$root ] && python3 bench/gpu/triton_timeline.py /tmp/turingbox-bench/$root \
                  --json $R/startup/triton-timeline-$root.json > $R/startup/triton-timeline-$root.txt 2>&1
              done ;;
    kvcut)    # issue 35's first cut: a seeded start given the KV size the seed's loading start recorded in the entry
              # (--kv-cache-memory-bytes, so vLLM skips its CUDA-graph memory profile) against one that profiles, twice
              # each (KVCUT_STARTS, default "profiled given profiled given"; "given" alone when time is short: the seed's
              # loading start is then the profiled one), each from a fresh copy of the same seed (startup's steps;
              # 64-layer demo, plan defaults; BENCH_MODEL=/tmp/demo4 BENCH_LAYERS=4: the 4-layer demo, when the device time
              # left cannot hold the 64-layer seed)
              build_modelinfos_once
              [ -z "${BENCH_MODEL:-}" ] || [ -d "$BENCH_MODEL" ] || python3 -m turingbox demo-model "$BENCH_MODEL" \
                --layers "${BENCH_LAYERS:-4}" > $R/demo-model.txt 2>&1
              startup_step seed ""
              i=0
              for kind in ${KVCUT_STARTS:-profiled given profiled given}; do
                i=$((i + 1))
                if [ "$kind" = given ]; then startup_step seeded "--only turingbox --label kv-given-$i --tb-env TURINGBOX_KV_SIZE_FROM_CACHE=1"
                else startup_step seeded "--only turingbox --label kv-profiled-$i --tb-env TURINGBOX_KV_SIZE_FROM_CACHE=0"; fi
              done
              startup_step report ""
              grep -h "KV cache size\|kv_cache_memory_bytes" /tmp/turingbox-bench/logs/*.log > $R/startup/kvcut-lines.txt 2>&1 ;;
    startupx) # after startup, on its caches: turingbox warm with a spawned engine core (fork's own share), then warm
              # under py-spy (where each second of a seeded start goes, per process; the wheel is staged in
              # .device-wheels/extra, bench/gpu/README.md), then warm without the active warmup, ~250 s.
              # Results: $R/startup, $R/startup/pyspy-warm.txt.gz
              # fork's share was read from session 11's seed (spawned) start; the control start costs ~90 s of device time
              [ -n "${STARTUP_SPAWN:-}" ] && startup_step warm "--only turingbox --label spawn --tb-env VLLM_WORKER_MULTIPROC_METHOD=spawn"
              if ls /tmp/dw/py_spy-*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps \
                   --target /tmp/pyspy /tmp/dw/py_spy-*.whl > $R/pyspy-install.txt 2>&1; then
                BENCH_TB_WRAP="/tmp/pyspy/bin/py-spy record --subprocesses --threads --idle --nonblocking --rate 50 --format raw -o /tmp/pyspy-warm.txt --" \
                  startup_step warm "--only turingbox --label pyspy"
                gzip -c /tmp/pyspy-warm.txt > $R/startup/pyspy-warm.txt.gz 2>> $R/pyspy-install.txt
              else
                echo "py-spy is not staged (.device-wheels/extra): no profile" >> $R/startup.txt
              fi
              # what the active warmup (7 s of session 11's warm start) buys: first TTFT vs the next, strict warmup only
              [ -n "${STARTUP_NOACTIVE:-}" ] && startup_step warm "--only turingbox --label no-active --tb-env TURINGBOX_ACTIVE_WARMUP=0"
              startup_step report "" ;;
    plmem)    # after startup, on its seeded turingbox caches (a warm start, same argv): one prompt_logprobs request of
              # ~8,000 tokens and the GPU's used memory before and after (session 10: the AWQ engine held 7.6 GiB over
              # its budget; the plugin slices prompt logprobs since). Result: $R/prompt-logprobs-memory.json
              timeout 400 python3 bench/gpu/side_by_side.py --model ${BENCH_MODEL:-/tmp/demo} --phase plmem --gpus $one,$one \
                --skip-plain --cache /tmp/turingbox-bench/tb-seeded-root --out $R --no-decode --ready-limit 300 \
                --after-timeout 120 \
                --after="curl -s http://127.0.0.1:\$PROXY_PORT/metrics > \$OUT/public-metrics-plmem.txt; python3 bench/gpu/prompt_logprobs_memory.py --url http://127.0.0.1:\$PROXY_PORT --gpu $one --json \$OUT/prompt-logprobs-memory.json > \$OUT/prompt-logprobs-memory.txt 2>&1" ;;
    soakawq)  # issue 15: the AWQ demo, cold, at AWQ_UTIL (0.33: beside soak64) of the GPU on other ports: first request
              # check, the same soak
              [ -d /tmp/demo-awq ] || python3 -m turingbox demo-model /tmp/demo-awq --awq
              # Starts take turns (soak_gate.sh): session 8 started this one once soakseed had sized its KV cache, and
              # its memory profile counted soak64's 77 GiB, loaded meanwhile, as its own (KV -71.5 GiB): don't.
              [ -z "$SOAK_PEER" ] || bash bench/gpu/soak_gate.sh $SOAK_PEER serving $SOAK_GATE_S >> $R/soak-gates.txt 2>&1
              rm -rf /tmp/tbsoak-awq
              # the image's model infos (Dockerfile: turingbox_warmup.image.modelinfos), which a new entry starts with: vLLM
              # then skips its two model-class inspections (session 9's cold AWQ start: 66 s before the engine)
              build_modelinfos_once
              timeout $soak_limit python3 bench/gpu/side_by_side.py --model /tmp/demo-awq --phase soakawq --gpus $one,$one \
                --skip-plain --cache /tmp/tbsoak-awq --out $R --no-decode --ready-limit 900 --port-offset 30 \
                --env TURINGBOX_AOT_MODELINFOS_DIR=/tmp/tb-modelinfos \
                --env TURINGBOX_GPU_MEMORY_UTILIZATION=${AWQ_UTIL:-0.33} --after-timeout $(( SOAK_MAX_S + SOAK_GATE_S + 600 )) \
                --after="touch /tmp/session/soakawq.serving; python3 bench/gpu/soak.py --url http://127.0.0.1:\$PROXY_PORT $soak_args --tag soakawq > \$OUT/soak-soakawq.txt 2>&1; $(gpu_memory soakawq); python3 -m turingbox jit-report --url http://127.0.0.1:\$PROXY_PORT --output \$OUT/jit-report-soakawq.json > \$OUT/jit-report-soakawq.txt 2>&1; $(soak_gate plain-serving)"
              touch /tmp/session/soakawq.serving
              python3 bench/gpu/soak.py --verdict --tag soakawq --out $R --log turingbox-soakawq.log > $R/verdict-soakawq.txt 2>&1 ;;
    replay8)  # issue 15 beside soakawq: session 8's soak records replayed against turingbox with the fixes since
              # (4-layer demo served as "demo", eager, session 8's max_model_len and max_num_seqs), compared by id with
              # plain vLLM's answers recorded in session 8 (soak.py --against); started once SOAK_PEER serves (session 9: its
              # first start, compiling beside the AWQ soak, missed a 400 s ready limit)
              D8=docs/data/2026-12-02-h200-s8; mkdir -p /tmp/s8
              zcat $D8/soak-soak64.jsonl.gz > /tmp/s8/soak-soak64.jsonl; cp $D8/soak-soak64.json /tmp/s8/
              zcat $D8/replay-soak64.jsonl.gz > /tmp/s8/replay-plain-soak64.jsonl
              [ -d /tmp/r8/demo ] || python3 -m turingbox demo-model /tmp/r8/demo --layers 4
              [ -z "$SOAK_PEER" ] || bash bench/gpu/soak_gate.sh $SOAK_PEER serving $SOAK_GATE_S >> $R/soak-gates.txt 2>&1
              timeout 900 python3 bench/gpu/side_by_side.py --model /tmp/r8/demo --phase replay8 --gpus $one,$one \
                --skip-plain --cache /tmp/tbcache-replay8 --out $R --no-decode --ready-limit 600 --port-offset 60 \
                --extra=--enforce-eager --env TURINGBOX_GPU_MEMORY_UTILIZATION=0.3 --env TURINGBOX_MAX_MODEL_LEN=19200 \
                --env TURINGBOX_MAX_NUM_SEQS=16 --after-timeout 400 \
                --after="python3 bench/gpu/soak.py --replay /tmp/s8/soak-soak64.jsonl --url http://127.0.0.1:\$PROXY_PORT --replay-concurrency 8 --tag s8-fixed --against /tmp/s8/replay-plain-soak64.jsonl --out \$OUT > \$OUT/replay-s8-fixed.txt 2>&1" ;;
    fibaked)  # issue 20 beside the 64-layer soak: FlashInfer's sm_90 modules baked vs JIT-built (4-layer demo, FLASHINFER,
              # bf16) at 0.3 of the GPU, started once soak64's server has sized its KV cache (one GPU: starts take turns);
              # lane a's soak64 waits for this phase's end before it stops (SOAK_PEER=fibaked)
              bash bench/gpu/soak_gate.sh soak64 serving ${FIBAKED_GATE_S:-1500} >> $R/soak-gates.txt 2>&1
              mkdir -p $R/fibaked
              TURINGBOX_GPU_MEMORY_UTILIZATION=${FIBAKED_UTIL:-0.3} OUT=$R/fibaked timeout 1500 \
                bash bench/gpu/flashinfer_baked_check.sh > $R/fibaked/flashinfer_baked_check.txt 2>&1 ;;
    ckptwrite) # issue 35 item 3: the 64-layer AWQ demo's real-size checkpoint (~19.5 GB) with random values, in /tmp/ckpt-awq
              [ -d /tmp/ckpt-awq ] || python3 -m turingbox demo-model /tmp/ckpt-awq --awq > $R/ckpt-demo-model.txt 2>&1
              mkdir -p $R/ckpt
              python3 bench/checkpoint_load.py tensors /tmp/ckpt-awq --check-vllm > $R/ckpt/tensors.txt 2>&1
              timeout 900 python3 bench/checkpoint_load.py write /tmp/ckpt-awq > $R/ckpt/write.json 2> $R/ckpt/write.log ;;
    ckptload)  # after ckptwrite, alone on the machine: the disk's sequential read speed, then plain vLLM per load format
              # (runai_streamer's wheels in .device-wheels/extra, copied to /tmp/dw)
              for _ in $(seq 1 120); do [ -f /tmp/session/ckptwrite.done ] && break; sleep 5; done   # poll: the other lane's write
              mkdir -p $R/ckpt
              ls /tmp/dw/runai_model_streamer-*.whl > /dev/null 2>&1 && python3 -m pip install -q --no-index --no-deps \
                --target /tmp/site /tmp/dw/runai_model_streamer-*.whl /tmp/dw/humanize-*.whl > $R/ckpt/runai-install.txt 2>&1
              python3 bench/checkpoint_load.py disk /tmp/ckpt-awq --out $R/ckpt/disk.json > $R/ckpt/disk.txt 2>&1
              timeout 900 python3 bench/checkpoint_load.py load /tmp/ckpt-awq --disk-json $R/ckpt/disk.json \
                --out $R/ckpt/checkpoint_load.json --logs $R/ckpt/logs \
                --formats ${CKPT_FORMATS:-safetensors,fastsafetensors,runai_streamer,safetensors-prefetch} > $R/ckpt/load.txt 2>&1 ;;
    *)        echo "unknown phase $phase" ;;
  esac
  echo "=== $phase done rc=$? in $(( $(date +%s) - t0 )) s"
  touch /tmp/session/$phase.done
done
