#!/usr/bin/env bash
# Install what building and smoke-testing the image needs on a bare Debian 12 machine:
# Docker engine (docker.io), debootstrap (the stand-in base), Compose v1 (docker-compose, for the
# v1 compatibility check), make, a C toolchain and Debian's python3.11 for the tests and, as Docker
# CLI plugins, Compose v2 and buildx. Bookworm packages neither of the last two; Debian 13's builds
# need only libc6 >= 2.34, so their binaries are taken from Debian's own trixie packages (downloaded
# with apt into a private state directory, unpacked into /usr/local/lib/docker/cli-plugins; the
# system's package state is not touched).
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
PLUGIN_DIR=${DOCKER_CLI_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v make >/dev/null || need+=(make)             # .ci/run ends in `make test`
# Triton builds its C launchers (tests/turingbox_warmup/image/test_triton_aot.py) with gcc, against libc's and Python's headers
command -v gcc >/dev/null || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)      # only a Recommends of gcc
[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
# Debian's own interpreter: tests/turingbox_warmup/python_image.py copies it into the tiny image of the bake tests
[ -x /usr/bin/python3.11 ] || need+=(python3.11)
# `make dev` builds a venv: Debian splits venv/ensurepip into python3-venv
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
need_root() {  # apt-get needs root: say so in one sentence instead of apt's lock-file errors
  [ "$(id -u)" = 0 ] && return 0
  echo "install-docker-tools: $1 must be installed and that needs root: run sudo make test-setup (or install it yourself), then make test again." >&2
  exit 2
}
if [ ${#need[@]} -gt 0 ]; then
  need_root "${need[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  echo "install-docker-tools: installed ${need[*]}"
fi

if [ "${FORCE:-0}" != 1 ] && docker compose version >/dev/null 2>&1 && docker buildx version >/dev/null 2>&1; then
  echo "install-docker-tools: $(docker compose version), buildx $(docker buildx version | awk '{print $2}')"
  exit 0
fi

need_root "Docker Compose v2 and buildx (CLI plugins)"
state=$(mktemp -d /var/tmp/turingbox-apt.XXXXXX)
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial" "$state/cache/archives/partial" "$state/debs" "$state/root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $("$(dirname "$0")/debian-mirror.sh" main) trixie main" \
  >"$state/sources.list"
apt_opts=(-o "Dir::Etc::SourceList=$state/sources.list" -o Dir::Etc::SourceParts=/dev/null
          -o "Dir::State::Lists=$state/lists" -o "Dir::Cache=$state/cache"
          -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update -qq
(cd "$state/debs" && apt-get "${apt_opts[@]}" download -qq docker-compose docker-buildx)
for deb in "$state"/debs/*.deb; do dpkg-deb -x "$deb" "$state/root"; done
install -d "$PLUGIN_DIR"
install -m 0755 "$state"/root/usr/libexec/docker/cli-plugins/docker-compose \
                "$state"/root/usr/libexec/docker/cli-plugins/docker-buildx "$PLUGIN_DIR/"
echo "install-docker-tools: $("$PLUGIN_DIR/docker-compose" version), buildx $("$PLUGIN_DIR/docker-buildx" version | awk '{print $2}')"
