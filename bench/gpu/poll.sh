#!/usr/bin/env bash
# GPU machine: wait up to $1 seconds for phase $2 (or everything) to finish, then pack /tmp/results into $OUT.
limit=${1:-500}; want=${2:-all}
# want: a phase or lane name, or several separated by commas (all of them must be done)
all_done() { local n; for n in ${want//,/ }; do [ -f /tmp/session/$n.done ] || return 1; done; }
for ((i = 0; i < limit; i += 5)); do
  all_done || [ -f /tmp/session/all.done ] && break
  sleep 5
done
ls /tmp/session; tail -n 25 /tmp/session*.log
for f in /tmp/results/*.log; do [ -f "$f" ] && echo "--- $f" && grep -E "ERROR|Error|error:|Traceback|KV cache|ready|warmup" "$f" | tail -n 8; done
tar -C /tmp -czf "$OUT/results.tgz" results $(cd /tmp && ls session*.log 2>/dev/null); ls -la "$OUT"
