#!/usr/bin/env bash
# Build plugin/turingbox_plugin/lib/libturingbox_gdn.so (turingbox GDN kernels) with nvcc.
#   ARCHS="75 80 86 89 90" (default) — SASS for each, plus PTX of the last for newer GPUs.
#   NVCC=/path/to/nvcc, GDN_LIB_OUT=/path/to/lib.so, JOBS=N (nvcc --threads) may be overridden.
# Needs no GPU and no torch: the library is plain CUDA C with extern "C" entry points.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/turingbox_plugin/csrc"
out="${GDN_LIB_OUT:-$here/turingbox_plugin/lib/libturingbox_gdn.so}"
nvcc="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
archs="${ARCHS:-75 80 86 89 90}"
gencode=()
last=""
for a in $archs; do gencode+=("-gencode" "arch=compute_${a},code=sm_${a}"); last="$a"; done
gencode+=("-gencode" "arch=compute_${last},code=compute_${last}")
mkdir -p "$(dirname "$out")"
tmp="$(mktemp "${out}.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
"$nvcc" -O3 -std=c++17 -shared -Xcompiler -fPIC -cudart static --threads "${JOBS:-0}" \
  "${gencode[@]}" -o "$tmp" "$src/gdn_prefill.cu" "$src/gdn_decode.cu"
mv -f "$tmp" "$out"   # atomic: a half-written library is never loaded
trap - EXIT
echo "built $out (archs: $archs)"
