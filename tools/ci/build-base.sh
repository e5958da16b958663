#!/usr/bin/env bash
# Build the CI stand-in for the CUDA base image: Debian bookworm made with debootstrap, imported with
# `docker import`. No container registry is reachable here, so the real Dockerfile is built on this
# (`--build-arg BASE_IMAGE=turingbox-base:bookworm`). The machine's CA bundle goes in as an extra CA,
# so pip inside builds works behind a TLS-intercepting proxy. When this machine has a CUDA toolkit
# (CUDA_HOME, default /usr/local/cuda: nvcc, ptxas, headers), it is copied to /usr/local/cuda as in
# NVIDIA's devel images, so the build compiles the plugin's GDN library and Triton finds ptxas there.
#
# Usage: tools/ci/build-base.sh [TAG]      (default turingbox-base:bookworm)
# Env:   DEBIAN_MIRROR and DEBIAN_SECURITY_MIRROR (default: what this machine's apt uses), CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt), FORCE=1 to rebuild.
# Skips the work when an image with TAG was built from the same script and CA bundle.
set -euo pipefail

TAG=${1:-turingbox-base:bookworm}
SUITE=bookworm
here=$(cd "$(dirname "$0")" && pwd)
MIRROR=${DEBIAN_MIRROR:-$("$here/debian-mirror.sh" main)}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-$("$here/debian-mirror.sh" security)}
CA_BUNDLE=${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cuda_version=""
if [ -x "$CUDA_HOME/bin/nvcc" ]; then
  cuda_version=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
fi
# What the Dockerfile's OS stage installs anyway: having it in the base saves a download per build.
PACKAGES=ca-certificates,python3,python3-venv,python3-pip,python3-dev

inputs_hash=$( (cat "$0" "$CA_BUNDLE"; echo "cuda=$cuda_version") | sha256sum | cut -c1-16)
if [ "${FORCE:-0}" != 1 ] && [ "$(docker image inspect -f '{{ index .Config.Labels "org.turingbox.base-inputs" }}' "$TAG" 2>/dev/null)" = "$inputs_hash" ]; then
  echo "build-base: $TAG is up to date ($inputs_hash)"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build-base: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

workdir=$(mktemp -d /var/tmp/turingbox-base.XXXXXX)
trap 'rm -rf "$workdir"' EXIT
rootfs="$workdir/rootfs"

debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >"$workdir/debootstrap.log" 2>&1 || {
  echo "build-base: debootstrap failed; last lines:" >&2; tail -30 "$workdir/debootstrap.log" >&2; exit 1; }

# The machine's bundle as an extra CA: it survives any later update-ca-certificates run in the image.
install -m 0644 "$CA_BUNDLE" "$rootfs/usr/local/share/ca-certificates/turingbox-build-host.crt"
chroot "$rootfs" update-ca-certificates >"$workdir/ca.log" 2>&1 || { cat "$workdir/ca.log" >&2; exit 1; }
if [ -n "$cuda_version" ]; then
  cp -a "$(readlink -f "$CUDA_HOME")" "$rootfs/usr/local/cuda-$cuda_version"
  ln -sfn "cuda-$cuda_version" "$rootfs/usr/local/cuda"
fi
cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
SOURCES
# like the official images: no recommends, no caches in layers
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' >"$rootfs/etc/apt/apt.conf.d/90turingbox-no-recommends"
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/tmp/*

tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change "LABEL org.turingbox.base-cuda=${cuda_version:-none}" \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL org.turingbox.base-inputs=$inputs_hash org.opencontainers.image.description=\"turingbox CI stand-in for the CUDA base: Debian $SUITE\"" \
  --change 'CMD ["bash"]' \
  - "$TAG" >/dev/null
echo "build-base: built $TAG (CUDA toolkit: ${cuda_version:-none}, $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}'))"
