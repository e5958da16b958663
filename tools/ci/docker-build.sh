#!/usr/bin/env bash
# `docker build` that works with whatever this Docker offers: BuildKit when the client has it
# (a buildx plugin, or a pre-23 client with BuildKit built in), otherwise the classic builder on a
# copy of the Dockerfile without `RUN --mount=type=cache` options (the only BuildKit-only syntax the
# Dockerfile uses; its steps detect the missing cache mount themselves).
#
# Usage: tools/ci/docker-build.sh [docker build options] CONTEXT
# Env:   DOCKER_BUILDKIT=0 forces the classic builder; DOCKERFILE (default CONTEXT/Dockerfile).
set -euo pipefail

[ $# -ge 1 ] || { echo "usage: $0 [docker build options] CONTEXT" >&2; exit 2; }
context="${*: -1}"
dockerfile="${DOCKERFILE:-$context/Dockerfile}"

buildkit_client() {
  # prints the docker client to use with BuildKit, or nothing
  if docker buildx version >/dev/null 2>&1; then echo docker; return; fi
  local client major
  for client in docker /usr/bin/docker; do
    command -v "$client" >/dev/null 2>&1 || continue
    major=$("$client" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
    # clients before 23.0 carry BuildKit themselves; later ones need the buildx plugin
    if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ]; then echo "$client"; return; fi
  done
}

client=""
[ "${DOCKER_BUILDKIT:-1}" = 0 ] || client=$(buildkit_client)
if [ -n "$client" ]; then
  echo "docker-build: BuildKit ($client)" >&2
  DOCKER_BUILDKIT=1 exec "$client" build --progress=plain -f "$dockerfile" "$@"
fi

echo "docker-build: classic builder (BuildKit off or unavailable): cache mounts removed" >&2
classic=$(mktemp /tmp/Dockerfile.classic.XXXXXX)
trap 'rm -f "$classic"' EXIT
sed -E 's/--mount=type=cache[^ ]* //g' "$dockerfile" >"$classic"
DOCKER_BUILDKIT=0 docker build -f "$classic" "$@"
