# turingbox: vLLM 0.21.0 + the turingbox plugin and sidecar, on CUDA 13.
#
#   make image                                   # BuildKit (pip cache mount)
#   make image BASE_IMAGE=turingbox-base:bookworm EXTRA_CA_CERT=/path/proxy-ca.crt
#   tools/ci/docker-build.sh -t turingbox:dev .   # also works with the classic builder
#
# Stages: os (Python, compiler, tini) -> deps (locked Python packages, cached) -> wheels (this
# repository, built without network) -> flashinfer-aot (FlashInfer's JIT modules, nvcc, no GPU) ->
# runtime (deps + wheels + baked caches, non-root).
# The base must be a CUDA *devel* image in production: Triton assembles with ptxas, and FlashInfer JIT-compiles
# with nvcc whatever the flashinfer-aot stage did not bake (other arches, settings, a newer FlashInfer); both
# also need a host C/C++ compiler and Python headers.
ARG BASE_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04

# ---------------------------------------------------------------------------------------------
FROM ${BASE_IMAGE} AS os
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    LANG=C.UTF-8
# Versions come from the base's distribution (Ubuntu 24.04, or Debian 12 for the CI stand-in),
# so they are not pinned here; the Python stack is pinned in requirements/image-lock.txt.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates python3 python3-venv python3-dev gcc g++ tini \
 && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------------------------------------
FROM os AS deps
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Builds behind a TLS-intercepting proxy: its CA (PEM, base64-encoded) is trusted for this stage's
# downloads only and removed again in the same step, so the image does not carry it.
ARG EXTRA_CA_CERT_B64=""
# A private index or mirror (never with credentials in it: build arguments show in `docker history`).
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
COPY requirements/image-lock.txt /tmp/image-lock.txt
# The pip cache is a BuildKit cache mount; under the classic builder (mount stripped by
# tools/ci/docker-build.sh) it is not a mount point and pip runs without a cache.
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    set -eu; \
    if [ -n "$EXTRA_CA_CERT_B64" ]; then \
      echo "$EXTRA_CA_CERT_B64" | base64 -d > /usr/local/share/ca-certificates/turingbox-build-extra.crt; \
      update-ca-certificates >/dev/null 2>&1; \
    fi; \
    cache_opt=--no-cache-dir; \
    if mountpoint -q /root/.cache/pip; then cache_opt=""; fi; \
    python3 -m venv /opt/venv; \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/venv/bin/pip install $cache_opt \
      --disable-pip-version-check --no-input --progress-bar off \
      ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} ${PIP_EXTRA_INDEX_URL:+--extra-index-url "$PIP_EXTRA_INDEX_URL"} \
      --requirement /tmp/image-lock.txt; \
    rm -f /usr/local/share/ca-certificates/turingbox-build-extra.crt /tmp/image-lock.txt; \
    update-ca-certificates --fresh >/dev/null 2>&1

# ---------------------------------------------------------------------------------------------
FROM deps AS wheels
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# auto: build the sm_75+ GDN library when the base has nvcc (the CUDA devel base does);
# 1: require it; 0: skip (the plugin then keeps vLLM's GDN path).
ARG BUILD_GDN_LIB=auto
COPY plugin /src/plugin
COPY pyproject.toml /src/app/pyproject.toml
COPY entrypoint /src/app/entrypoint
COPY warmup /src/app/warmup
WORKDIR /src
RUN set -eu; \
    nvcc_bin=$(command -v nvcc || true); \
    if [ "$BUILD_GDN_LIB" != 0 ] && [ -n "$nvcc_bin" ]; then \
      NVCC="$nvcc_bin" bash plugin/build_gdn.sh; \
    elif [ "$BUILD_GDN_LIB" = 1 ]; then \
      echo "BUILD_GDN_LIB=1 but this base has no nvcc: use a CUDA devel base image." >&2; exit 1; \
    else \
      echo "GDN library not built (BUILD_GDN_LIB=$BUILD_GDN_LIB, nvcc: ${nvcc_bin:-none})"; \
    fi; \
    /opt/venv/bin/pip wheel --no-deps --no-build-isolation --no-cache-dir --wheel-dir /wheels ./plugin ./app

# ---------------------------------------------------------------------------------------------
FROM deps AS flashinfer-aot
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# FlashInfer's JIT modules for the image's plans (warmup/turingbox_warmup/image/aot_specs/flashinfer-*.jsonl: the
# batch-prefill module of each FLASHINFER plan, the sampling module of every plan), built without a GPU by
# FlashInfer's own JitSpec.build() (ninja + nvcc) into the layout FlashInfer loads from; every new cache entry
# starts with a copy (docs/caches.md), so a first start on a 2080 Ti runs nvcc zero times. Only the result
# leaves this stage. nvcc: the base's (CUDA devel), else the nvidia-cuda-* wheels of the image's CUDA 13.0.
#   FLASHINFER_AOT_ARCHS    compute capabilities (the default modules of each: aot_specs `default`)
#   FLASHINFER_AOT_MODULES  all | auto | none | a comma list of modules (batch_prefill, sampling) or URIs;
#                           auto = all with 4 or more CPUs, else only the sm_75 sampling module: one head_dim-256
#                           batch-prefill module takes ~12 min of nvcc per arch on 2 cores (the CI build); the
#                           sm_75 check below still compiles the prefill kernels a 2080 Ti launches (~1.5 min)
ARG FLASHINFER_AOT_ARCHS=7.5,8.0,8.6,8.9,9.0
ARG FLASHINFER_AOT_MODULES=auto
ARG CUDA_NVCC_WHEELS="nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85"
ARG EXTRA_CA_CERT_B64=""
ARG PIP_INDEX_URL=""
ARG PIP_EXTRA_INDEX_URL=""
COPY --from=wheels /wheels /tmp/wheels
# FlashInfer's ninja tree is a BuildKit cache mount: an unchanged module is not rebuilt by the next image build.
# (Word splitting of $CUDA_NVCC_WHEELS, $build_dir and $only is intended.)
# hadolint ignore=SC2086
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=cache,target=/root/.cache/turingbox-flashinfer-build,sharing=locked \
    set -eu; \
    /opt/venv/bin/pip install --no-deps --no-index --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl; \
    mkdir -p /opt/turingbox/flashinfer-aot; \
    modules="$FLASHINFER_AOT_MODULES"; archs="$FLASHINFER_AOT_ARCHS"; \
    if [ "$modules" = none ] || [ -z "$archs" ]; then echo "flashinfer-aot: skipped (FLASHINFER_AOT_MODULES=none)"; exit 0; fi; \
    if [ "$modules" = auto ]; then \
      if [ "$(nproc)" -ge 4 ]; then modules=all; else modules=sampling; archs=7.5; \
        echo "flashinfer-aot: $(nproc) CPUs: building only the sm_75 sampling module (FLASHINFER_AOT_MODULES=all builds every one)"; fi; \
    fi; \
    if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then \
      if [ -n "$EXTRA_CA_CERT_B64" ]; then \
        echo "$EXTRA_CA_CERT_B64" | base64 -d > /usr/local/share/ca-certificates/turingbox-build-extra.crt; \
        update-ca-certificates >/dev/null 2>&1; \
      fi; \
      cache_opt=--no-cache-dir; if mountpoint -q /root/.cache/pip; then cache_opt=""; fi; \
      PIP_CERT=/etc/ssl/certs/ca-certificates.crt /opt/venv/bin/pip install $cache_opt --disable-pip-version-check \
        --no-input --progress-bar off ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"} \
        ${PIP_EXTRA_INDEX_URL:+--extra-index-url "$PIP_EXTRA_INDEX_URL"} $CUDA_NVCC_WHEELS; \
      rm -f /usr/local/share/ca-certificates/turingbox-build-extra.crt; \
    fi; \
    build_dir=""; if mountpoint -q /root/.cache/turingbox-flashinfer-build; then build_dir="--build-dir /root/.cache/turingbox-flashinfer-build"; fi; \
    only=""; if [ "$modules" != all ]; then for m in $(echo "$modules" | tr , ' '); do only="$only --only $m"; done; fi; \
    PATH=/opt/venv/bin:$PATH python -m turingbox_warmup.image.flashinfer_aot build --arch "$archs" \
      --out /opt/turingbox/flashinfer-aot $build_dir $only; \
    PATH=/opt/venv/bin:$PATH python -m turingbox_warmup.image.flashinfer_aot check --arch 7.5 --dir /opt/turingbox/flashinfer-aot; \
    chmod -R a+rX,go-w /opt/turingbox/flashinfer-aot

# ---------------------------------------------------------------------------------------------
FROM deps AS runtime
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG BASE_IMAGE
ARG TURINGBOX_VERSION=0.1.0
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="turingbox" \
      org.opencontainers.image.description="A box of NVIDIA GPUs -> a sized, warmed, healthy OpenAI-compatible vLLM endpoint" \
      org.opencontainers.image.version="${TURINGBOX_VERSION}" \
      org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.turingbox.vllm.version="0.21.0" \
      org.turingbox.torch.version="2.11.0" \
      org.turingbox.triton.version="3.6.0" \
      org.turingbox.flashinfer.version="0.6.8.post1"

ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/turingbox \
    TURINGBOX_CACHE_DIR=/cache \
    TURINGBOX_MODELS_DIR=/models \
    XDG_CACHE_HOME=/cache/xdg \
    HF_HOME=/models/huggingface \
    TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas \
    TRITON_CACHE_AUTOTUNING=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1

COPY --from=wheels /wheels /tmp/wheels
RUN pip install --no-deps --no-index --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && pip check

# Ahead-of-time Triton kernels for Turing..Hopper, compiled without a GPU by this image's own
# Triton and ptxas (the cache key includes both), into a read-only layer the runtime consults; with
# them the C launcher per kernel signature and Triton's cuda_utils, built by gcc against a stub libcuda.
ARG TRITON_AOT_ARCHS=7.5,8.0,8.6,8.9,9.0
RUN python -m turingbox_warmup.image.triton_aot --arch "${TRITON_AOT_ARCHS}" --cache-dir /opt/turingbox/triton-cache
# Each new cache entry starts with these kernels (turingbox.cache.store copies them in).
ENV TURINGBOX_AOT_TRITON_DIR=/opt/turingbox/triton-cache

# vLLM's model-class facts for the image's architectures (Qwen3.6 and its MTP drafter), written by vLLM's own
# registry without a GPU: without them vLLM imports each class in a fresh interpreter at every start from an empty
# cache entry (44-66 s on the H200, docs/startup.md). Each new cache entry starts with a copy.
RUN python -m turingbox_warmup.image.modelinfos --out /opt/turingbox/vllm-modelinfos
ENV TURINGBOX_AOT_MODELINFOS_DIR=/opt/turingbox/vllm-modelinfos

# FlashInfer's modules from the flashinfer-aot stage (<dir>/.cache/flashinfer/<version>/<arch>/cached_ops/<uri>/);
# a new cache entry's flashinfer/ (FLASHINFER_WORKSPACE_BASE) starts with a copy of them.
COPY --from=flashinfer-aot /opt/turingbox/flashinfer-aot /opt/turingbox/flashinfer-aot
ENV TURINGBOX_AOT_FLASHINFER_DIR=/opt/turingbox/flashinfer-aot

# Non-root user; group 0 may write the volumes too (OpenShift-style arbitrary UIDs). The home
# directory already exists (the AOT step above ran as root with HOME set), so hand it over.
RUN groupadd --gid 10001 turingbox \
 && useradd --uid 10001 --gid 10001 --groups 0 --home-dir /home/turingbox --create-home \
      --shell /usr/sbin/nologin turingbox \
 && install -d -o 10001 -g 0 -m 0775 /cache /models \
 && chown -R 10001:0 /home/turingbox

# The demo model's tokenizer (converted from the tiktoken ranks, ~1 min) is built once here, so
# a first start only writes the model's config. It sits in /models; a named volume mounted there
# starts as a copy of it.
USER 10001:10001
RUN turingbox demo-model --tokenizer-only

WORKDIR /home/turingbox
VOLUME ["/cache", "/models"]
EXPOSE 8000
# Liveness only (200 while starting): readiness is /health/ready, for orchestrators that route traffic.
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health/live' % os.environ.get('TURINGBOX_PORT', '8000'), timeout=4)"]
# `python -m turingbox` (its __main__) drops a repeated program name: `docker run IMAGE turingbox doctor` works too.
ENTRYPOINT ["tini", "--", "python3", "-P", "-m", "turingbox"]
CMD ["serve"]
