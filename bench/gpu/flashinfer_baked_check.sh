#!/usr/bin/env bash
# GPU machine (H200, sm_90; vLLM 0.21 with its FlashInfer 0.6.8.post1; nvcc 13 on PATH or in /usr/local/cuda).
#   OUT=/tmp/out bash bench/gpu/flashinfer_baked_check.sh            (about 10-15 min; sources bootstrap.sh)
# Issue 20: FlashInfer's JIT modules baked ahead of time (turingbox_warmup.image.flashinfer_aot) mean a start invokes
# nvcc zero times. Plan: the 4-layer demo with TURINGBOX_ATTENTION_BACKEND=FLASHINFER TURINGBOX_DTYPE=bfloat16.
#   1. `flashinfer_aot build --plan-json` builds that plan's modules (sm_90a: the fa2 bf16/e4m3 batch prefill
#      and the sampler) with FlashInfer's own JitSpec.build() into a fresh directory, with the real nvcc;
#   2. "baked": a fresh cache root whose entry for the plan holds them (`flashinfer_aot install`, what a new
#      entry gets from the image's TURINGBOX_AOT_FLASHINFER_DIR), then `turingbox serve` from it;
#   3. "cold": the same serve from another fresh cache root, without them.
# Both serves see an `nvcc` shim first (CUDA_HOME points at a tree whose bin/nvcc logs every call with a
# timestamp, then runs the real one), so FlashInfer's nvcc calls are counted before and after ready; also the
# .cuda.o files a JIT build leaves in the entry, seconds to ready, the first and second request's TTFT and the
# sidecar's turingbox_jit_after_ready (Triton). Writes $OUT/flashinfer_baked_check.json and the logs.
set -u
source bench/gpu/bootstrap.sh
OUT=${OUT:-/tmp/out}
W=${FI_WORK:-/tmp/fibaked}
READY_TIMEOUT_S=${READY_TIMEOUT_S:-900}
PORT=${PORT:-8123}
mkdir -p "$OUT"
rm -rf "$W"; mkdir -p "$W"

real_nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
real_home=$(dirname "$(dirname "$(readlink -f "$real_nvcc")")")
[ -x "$real_home/bin/nvcc" ] || { echo "no nvcc on this machine" >&2; exit 1; }
# The shim tree: every entry of the real toolkit, bin/ too, except bin/nvcc.
mkdir -p "$W/cuda/bin"
for p in "$real_home"/*; do [ "$(basename "$p")" = bin ] || ln -s "$p" "$W/cuda/$(basename "$p")"; done
for p in "$real_home"/bin/*; do [ "$(basename "$p")" = nvcc ] || ln -s "$p" "$W/cuda/bin/$(basename "$p")"; done
cat > "$W/cuda/bin/nvcc" <<EOF
#!/bin/sh
echo "\$(date +%s.%N) \$*" >> "\${NVCC_LOG:-$W/nvcc-unknown.log}"
exec "$real_home/bin/nvcc" "\$@"
EOF
chmod +x "$W/cuda/bin/nvcc"

[ -f /tmp/demo4/config.json ] || python3 -m turingbox demo-model /tmp/demo4 --layers 4
export TURINGBOX_MODEL=/tmp/demo4 TURINGBOX_ATTENTION_BACKEND=FLASHINFER TURINGBOX_DTYPE=bfloat16
export TURINGBOX_PORT=$PORT TURINGBOX_SERVED_MODEL_NAME=demo4

python3 -m turingbox plan --json > "$W/plan.json" || { echo "plan failed" >&2; exit 1; }
python3 -m turingbox_warmup.image.flashinfer_aot list --plan-json "$W/plan.json" > "$OUT/fi-modules.jsonl"
build_start=$(date +%s.%N)
CUDA_HOME=$real_home python3 -m turingbox_warmup.image.flashinfer_aot build --plan-json "$W/plan.json" --out "$W/aot" \
  > "$OUT/fi-build.log" 2>&1 || { echo "flashinfer_aot build failed: see $OUT/fi-build.log" >&2; tail -5 "$OUT/fi-build.log"; }
build_s=$(python3 -c "import time; print(round(time.time() - $build_start, 1))")
CUDA_HOME=$real_home python3 -m turingbox_warmup.image.flashinfer_aot check --arch 9.0 --dir "$W/aot" --json \
  > "$OUT/fi-check-sm90.json" 2>&1 || true

prepare_entry() {  # prepare_entry ROOT [AOT_DIR]: the plan's entry (a resumable, incomplete one) with modules
  python3 - "$1" "${2:-}" "$W/plan.json" <<'PY'
import json, os, sys
from turingbox_warmup.image import flashinfer_aot
from turingbox.cache import store
root, aot, plan_path = sys.argv[1], sys.argv[2], sys.argv[3]
plan = json.load(open(plan_path))
key, inputs = store.plan_fingerprint(plan)
entry = store.entry_dir(root, key)
os.makedirs(os.path.join(entry, "flashinfer"), exist_ok=True)
store.write_json_atomic(os.path.join(entry, store.MANIFEST), store.new_manifest(key, inputs, "seeded"))
n = flashinfer_aot.seed_workspace(aot, os.path.join(entry, "flashinfer")) if aot else 0
print(json.dumps({"entry": entry, "installed": n}))
PY
}

measure() {  # measure NAME ROOT: serve from ROOT, wait for ready, two streaming requests, stop; JSON on stdout
  local name=$1 root=$2
  local log="$OUT/serve-$name.log" nvlog="$W/nvcc-$name.log"
  : > "$nvlog"
  local t0; t0=$(date +%s.%N)
  (TURINGBOX_CACHE_DIR=$root CUDA_HOME=$W/cuda PATH=$W/cuda/bin:$PATH NVCC_LOG=$nvlog \
     setsid python3 -m turingbox serve > "$log" 2>&1 & echo $! > "$W/serve-$name.pid")
  python3 - "$name" "$t0" "$PORT" "$READY_TIMEOUT_S" "$nvlog" "$root" <<'PY'
import glob, json, os, sys, time, urllib.request
name, t0, port, timeout, nvlog, root = sys.argv[1], float(sys.argv[2]), sys.argv[3], float(sys.argv[4]), sys.argv[5], sys.argv[6]
base = f"http://127.0.0.1:{port}"
ready = None
while time.time() - t0 < timeout:
    try:
        with urllib.request.urlopen(base + "/health/ready", timeout=5) as r:
            if r.status == 200:
                ready = time.time()
                break
    except Exception:
        pass
    time.sleep(1)
out = {"run": name, "ready_s": round(ready - t0, 1) if ready else None}
def ttft(prompt):
    body = json.dumps({"model": "demo4", "messages": [{"role": "user", "content": prompt}], "max_tokens": 32,
                       "stream": True, "temperature": 0.7, "top_p": 0.9}).encode()
    req = urllib.request.Request(base + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    s = time.time()
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if line.startswith(b"data: ") and b"content" in line:
                first = time.time() - s
                for _ in r:
                    pass
                return round(first, 3)
    return None
if ready:
    # a long prompt too: the prefill path with many pages (FlashInfer's paged prefill, split-KV merge)
    out["first_ttft_s"] = ttft("Write one sentence about GPUs. " * 200)
    out["second_ttft_s"] = ttft("Name three colours.")
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            out["jit_after_ready_metrics"] = [l for l in r.read().decode().splitlines()
                                              if l.startswith("turingbox_jit_after_ready") and not l.startswith("#")]
    except Exception as exc:
        out["jit_after_ready_metrics"] = f"error: {exc}"
calls = [l.split(" ", 1) for l in open(nvlog).read().splitlines() if l.strip()]
out["nvcc_calls"] = len(calls)
out["nvcc_calls_after_ready"] = sum(1 for t, _ in calls if ready and float(t) > ready)
out["nvcc_compiles"] = sum(1 for _, a in calls if " -c " in f" {a} ")
# FlashInfer's get_cuda_version() asks `nvcc --version` once per process (functools.cache; without nvcc it
# falls back to torch.version.cuda): a version query, not a compile
out["nvcc_version_queries"] = sum(1 for _, a in calls if a.strip() == "--version")
out["nvcc_first_args"] = [a[:300] for _, a in calls[:3]]
objs = glob.glob(os.path.join(root, "entries", "*", "flashinfer", ".cache", "flashinfer", "*", "*", "cached_ops", "*", "*.cuda.o"))
mods = glob.glob(os.path.join(root, "entries", "*", "flashinfer", ".cache", "flashinfer", "*", "*", "cached_ops", "*", "*.so"))
out["jit_object_files_in_entry"] = len(objs)
out["modules_in_entry"] = sorted(os.path.basename(m) for m in mods)
print(json.dumps(out))
PY
  local pid; pid=$(cat "$W/serve-$name.pid")
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  sleep 3
}

baked_entry=$(prepare_entry "$W/cache-baked" "$W/aot")
baked=$(measure baked "$W/cache-baked")
cold=$(measure cold "$W/cache-cold")
python3 - "$OUT/flashinfer_baked_check.json" "$build_s" "$baked_entry" "$baked" "$cold" "$W/plan.json" <<'PY'
import json, sys
path, build_s, entry, baked, cold, plan_path = sys.argv[1:7]
plan = json.load(open(plan_path))
baked, cold = json.loads(baked), json.loads(cold)
res = {"plan": {k: plan.get(k) for k in ("gpu_name", "compute_capability", "attention_backend", "dtype",
                                         "kv_cache_dtype", "num_speculative_tokens", "cache_key")},
       "aot_build_s": float(build_s), "baked_entry": json.loads(entry), "baked": baked, "cold": cold}
res["ok"] = (bool(baked.get("ready_s")) and baked.get("nvcc_compiles") == 0
             and baked.get("nvcc_calls") == baked.get("nvcc_version_queries")
             and baked.get("jit_object_files_in_entry") == 0)
if baked.get("ready_s") and cold.get("ready_s"):
    res["saved_ready_s"] = round(cold["ready_s"] - baked["ready_s"], 1)
if baked.get("first_ttft_s") and cold.get("first_ttft_s"):
    res["saved_first_ttft_s"] = round(cold["first_ttft_s"] - baked["first_ttft_s"], 3)
json.dump(res, open(path, "w"), indent=2)
print(json.dumps(res, indent=2))
PY
cp "$W"/nvcc-*.log "$OUT/" 2>/dev/null || true
