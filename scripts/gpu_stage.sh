#!/usr/bin/env bash
# Prepare, on a machine with PyPI, what scripts/gpu_check.sh needs on a GPU machine that
# has no network (Python 3.12, torch, triton and transformers already installed):
#
#   .whl/        wheels of the runtime's dependencies the GPU image lacks (the HTTP stack,
#                ZeroMQ, pydantic, xgrammar for constrained decoding), and FlashInfer
#   .gpu-model/  SmolLM2-135M's config.json and tokenizer files (no weights: the GGUF is
#                94 MiB, over what one call may carry; gpu_check.sh makes SmolLM2-shaped
#                random weights from this config unless SLUICE_GPU_MODEL names a model)
#
# Both folders are git-ignored (.gitignore) and travel with `carry`: they must stay
# under 64 MiB together with the working tree (this script prints the total).
#
#   scripts/gpu_stage.sh            # then, on the GPU machine: bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
FLASHINFER_VERSION=$(sed -n 's/^ARG FLASHINFER_VERSION=//p' Dockerfile)
TVM_FFI_VERSION=0.1.15.post2  # FlashInfer's and xgrammar's compiled dependency the image lacks
XGRAMMAR_VERSION=$(sed -n 's/^ *"xgrammar==\([^"]*\)".*/\1/p' pyproject.toml)
# the GPU image's interpreter and platform; versions follow this venv where it has them
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64)
pinned() { "$PY" -c "import importlib.metadata as m; print(f'$1=={m.version(\"$1\")}')"; }
PACKAGES=(
  "$(pinned fastapi)" "$(pinned starlette)" "$(pinned uvicorn)" "$(pinned pyzmq)"
  "$(pinned pydantic)" "$(pinned pydantic_core)" "$(pinned annotated-types)"
  "$(pinned typing-inspection)" "$(pinned opentelemetry-api)"
  "flashinfer-python==${FLASHINFER_VERSION}" "apache-tvm-ffi==${TVM_FFI_VERSION}"
  "xgrammar==${XGRAMMAR_VERSION}"
)
rm -rf .whl && mkdir -p .whl
"$PY" -m pip download -q --no-deps "${PLATFORM[@]}" -d .whl "${PACKAGES[@]}"

# SmolLM2's config and tokenizer, from the converted bundled model (make model)
model_dir=$("$PY" -c "from sluice.runtime.model.loader import default_cache_dir, resolve_model_path; print(resolve_model_path('smollm2-135m', default_cache_dir()))")
rm -rf .gpu-model && mkdir -p .gpu-model/smollm2
for f in config.json generation_config.json tokenizer.json tokenizer_config.json \
         special_tokens_map.json chat_template.jinja; do
  [ -f "$model_dir/$f" ] && cp "$model_dir/$f" .gpu-model/smollm2/
done
ls -la .whl .gpu-model/smollm2
tree_bytes=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
carry_bytes=$(du -cb .whl .gpu-model | tail -1 | cut -f1)
total=$(( (tree_bytes + carry_bytes) / 1048576 ))
echo "to carry: ${total} MiB of 64 (tree + .whl + .gpu-model)"
if [ "$total" -ge 64 ]; then echo "too large to carry in one call" >&2; exit 1; fi
echo "run: carry ['.whl', '.gpu-model'], command 'bash scripts/gpu_check.sh', timeout_s 540"
