#!/usr/bin/env bash
# GPU machine, the last staging call (restage.sh's last folder carried): join the xgrammar halves, copy the tree
# to /tmp/repo (the call's own checkout is replaced by the next call), install, start session.sh detached with
# the phases given (its SOAK_*/STARTUP_* settings come from this environment), then poll for POLL_S seconds.
#   usage (from the checkout): bash bench/gpu/launch.sh .device-wheels/s09 soakseed soak64
set -e
last=$1; shift
mkdir -p /tmp/dw && cp -r "$last/." /tmp/dw/
for x0 in /tmp/dw/*.whl.x0; do
  [ -f "$x0" ] || continue
  cat "$x0" "${x0%.x0}.x1" > "${x0%.x0}" && rm -f "$x0" "${x0%.x0}.x1"
done
rm -rf /tmp/repo && mkdir -p /tmp/repo && cp -a . /tmp/repo/ && cd /tmp/repo
cp bench/gpu/session.sh /tmp/session.sh
(setsid nohup bash /tmp/session.sh "$@" > /tmp/session.log 2>&1 &)
set +e
bash bench/gpu/poll.sh "${POLL_S:-400}" all | tail -n 40
