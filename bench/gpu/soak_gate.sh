#!/usr/bin/env bash
# GPU machine, two soak lanes on one GPU: wait until the peer phase NAME has reached WHAT (a marker
# /tmp/session/NAME.WHAT, e.g. "serving") or has ended (NAME.done), at most LIMIT seconds. vLLM's memory
# profiling reads the whole device's free memory, so one lane's server must not start (or stop) while the
# other's is between its first memory snapshot and its KV sizing.  Usage: soak_gate.sh NAME WHAT [LIMIT]
name=$1; what=$2; limit=${3:-900}
t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
  if [ -f "/tmp/session/$name.$what" ] || [ -f "/tmp/session/$name.done" ]; then
    echo "[$(date +%T)] gate: $name.$what after $(( $(date +%s) - t0 )) s"; exit 0
  fi
  sleep 2
done
echo "[$(date +%T)] gate: gave up waiting for $name.$what after $limit s"
