#!/usr/bin/env bash
# What `make up` needs before it builds anything, checked in order; the first one missing is refused in
# one sentence with its remedy and exit 2 (an image build takes many minutes: better to fail before it).
#
# Usage: tools/up-check.sh [up|down|logs]      (the make target it guards; default up)
#   up         a Docker daemon answers, Compose v2 is installed, nvidia-smi lists a GPU, Docker has the NVIDIA runtime
#   down|logs  the daemon and Compose v2 only
# Env: GPU_CHECK=0 skips the GPU checks (a remote DOCKER_HOST whose GPUs this machine cannot list).
set -uo pipefail

target=${1:-up}
what="make $target"
cpu_override="docker compose -f compose.yaml -f compose.cpu.yaml up -d"

refuse() {
  echo "$what: $1" >&2
  exit 2
}

command -v docker >/dev/null 2>&1 \
  || refuse "the docker CLI is not installed; install Docker Engine (https://docs.docker.com/engine/install/) and run $what again."
docker info >/dev/null 2>&1 \
  || refuse "no Docker daemon answers at ${DOCKER_HOST:-unix:///var/run/docker.sock} (docker info fails); start it (sudo systemctl start docker) or point DOCKER_HOST at one, then run $what again."
docker compose version >/dev/null 2>&1 \
  || refuse "Docker Compose v2 is not installed (docker compose version fails); install the docker-compose-plugin package (https://docs.docker.com/compose/install/linux/) and run $what again."

[ "$target" = up ] && [ "${GPU_CHECK:-1}" != 0 ] || exit 0

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
[ "${gpus:-0}" -gt 0 ] \
  || refuse "no NVIDIA GPU is visible here (nvidia-smi -L lists none) and turingbox serves only on NVIDIA GPUs; on a machine without one, \`make image && $cpu_override\` runs the CPU smoke-test override instead (it starts, says why it cannot plan, and exits)."
runtimes=$(docker info --format '{{range $name, $_ := .Runtimes}}{{$name}} {{end}}' 2>/dev/null)
[[ " $runtimes " == *" nvidia "* ]] \
  || refuse "Docker has no NVIDIA container runtime (docker info lists: ${runtimes% }), so the container would see no GPU; install the NVIDIA Container Toolkit, run sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker, then run $what again (or, without a GPU, \`$cpu_override\`)."
exit 0
