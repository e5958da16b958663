#!/usr/bin/env bash
# Start a Docker engine in the background when none answers, and wait until `docker info` works.
# The data root goes on the filesystem with the most free space (images here are ~10 GB);
# DOCKER_DATA_ROOT overrides it. The engine's log goes to $DOCKERD_LOG.
set -euo pipefail

DOCKERD_LOG=${DOCKERD_LOG:-/var/log/turingbox-dockerd.log}
WAIT_S=${DOCKERD_WAIT_S:-90}

if docker info >/dev/null 2>&1; then
  echo "start-dockerd: a Docker engine already answers"
  exit 0
fi
command -v dockerd >/dev/null || { echo "start-dockerd: dockerd is not installed (apt-get install docker.io)" >&2; exit 1; }

largest_mount() {
  # real block filesystems only; the one with the most available bytes
  df --output=avail,target -x tmpfs -x devtmpfs -x overlay -x squashfs 2>/dev/null \
    | tail -n +2 | sort -rn | awk 'NR==1 {print $2}'
}

if [ -z "${DOCKER_DATA_ROOT:-}" ]; then
  mount_point=$(largest_mount)
  if [ -z "$mount_point" ] || [ "$mount_point" = "/" ]; then
    DOCKER_DATA_ROOT=/var/lib/docker
  else
    DOCKER_DATA_ROOT="$mount_point/docker-data"
  fi
fi
mkdir -p "$DOCKER_DATA_ROOT"
echo "start-dockerd: data root $DOCKER_DATA_ROOT ($(df -h --output=avail "$DOCKER_DATA_ROOT" | tail -1 | tr -d ' ') free), log $DOCKERD_LOG"

# setsid: the engine must outlive this script and not receive the caller's job-control signals.
setsid dockerd --data-root "$DOCKER_DATA_ROOT" >"$DOCKERD_LOG" 2>&1 < /dev/null &
echo $! > /run/turingbox-dockerd.pid

for _ in $(seq "$WAIT_S"); do
  if docker info >/dev/null 2>&1; then
    echo "start-dockerd: engine up (pid $(cat /run/turingbox-dockerd.pid), $(docker version --format '{{.Server.Version}}'))"
    exit 0
  fi
  if ! kill -0 "$(cat /run/turingbox-dockerd.pid)" 2>/dev/null; then
    echo "start-dockerd: dockerd exited; last lines of its log:" >&2
    tail -20 "$DOCKERD_LOG" >&2
    exit 1
  fi
  sleep 1
done
echo "start-dockerd: no answer from dockerd after ${WAIT_S}s; last lines of its log:" >&2
tail -20 "$DOCKERD_LOG" >&2
exit 1
