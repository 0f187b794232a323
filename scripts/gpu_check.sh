#!/usr/bin/env bash
# The GPU check: one call on an NVIDIA GPU machine (H200 in mind; no network there).
#
#   here:   scripts/gpu_stage.sh   (wheels into .whl/, SmolLM2's config + tokenizer into .gpu-model/)
#   there:  bash scripts/gpu_check.sh   with carry ['.whl', '.gpu-model'], timeout_s 560
#
# It installs the carried wheels, prepares the model (SLUICE_GPU_MODEL if it names a model
# folder, else SmolLM2-shaped random weights: scripts/gpu_prepare_model.py), then runs,
# each within its own time cap and all within GPU_CHECK_BUDGET_S (450 s):
#
#   kernels   Triton and FlashInfer vs the torch backend on random paged batches (bf16)
#   moe       the Triton fused MoE vs the per-expert loop (bf16), and in a CUDA graph
#   model     greedy across torch / triton / flashinfer on the model; CUDA-graph decode = eager
#   sampling  FlashInfer's top-k / top-p / min-p kernels (flashinfer_sample)
#   decode    decode step time per batch bucket, eager vs CUDA graphs, flashinfer and triton
#   serving   benchmarks/bench_serving.py: sluice serve (auto backend, CUDA graphs) against
#             transformers generate on the same GPU, bf16 both
#
# One summary line per check ("CHECK name: PASS|FAIL|SKIPPED (seconds) details"), repeated
# at the end. Under $OUT: gpu_check.log (everything), summary.json (every check, the
# numbers), bench_serving.json, bench_server.log.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT=${OUT:-$REPO/gpu-check-results}
WORK=$(mktemp -d /tmp/gpu-check.XXXX)
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
START=$(date +%s)
DEADLINE=$(( START + ${GPU_CHECK_BUDGET_S:-450} ))
PY=${PY:-python3}
SUMMARY=()

summary() {
  local line="CHECK $*"
  SUMMARY+=("$line")
  echo "$line"
  printf '%s\n' "$line" >>"$WORK/summary.txt"
}

# run_step NAME CAP_SECONDS COMMAND...: runs COMMAND with the smaller of its cap and the
# time left, its output into the log and $WORK/NAME.log; sets STEP_RC and STEP_S
run_step() {
  local name=$1 cap=$2
  shift 2
  local left=$(( DEADLINE - $(date +%s) ))
  local budget=$(( left < cap ? left : cap ))
  STEP_RC=124 STEP_S=0
  if [ "$budget" -lt 15 ]; then
    return 1
  fi
  echo "=== $name (up to ${budget}s): $*"
  local t0=$(date +%s)
  timeout --kill-after=15 "$budget" "$@" 2>&1 | tee "$WORK/$name.log"
  STEP_RC=${PIPESTATUS[0]}
  STEP_S=$(( $(date +%s) - t0 ))
  return 0
}

pytest_result() {  # the closing "N passed, M failed ..." of a pytest log
  grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped)" "$WORK/$1.log" | tail -1 | tr -d '='
}

pytest_step() {  # NAME CAP FILE
  local name=$1 cap=$2 file=$3
  if ! run_step "$name" "$cap" "$PY" -m pytest -q -p no:cacheprovider -o addopts= -s \
      --junitxml="$WORK/$name.xml" "$file"; then
    summary "$name: SKIPPED (out of time)"
    return
  fi
  local result verdict=PASS
  result=$(pytest_result "$name")
  [ "$STEP_RC" -ne 0 ] && verdict=FAIL
  [ "$STEP_RC" -eq 124 ] && verdict="FAIL timed out"
  # on a GPU nothing should skip: a run that passed nothing proved nothing
  [ "$verdict" = PASS ] && ! grep -q "passed" <<<"$result" && verdict="FAIL nothing ran"
  summary "$name: $verdict (${STEP_S}s) ${result:-no pytest summary}"
}

# --- set-up -----------------------------------------------------------------------------
export PYTHONUNBUFFERED=1
export TRITON_INTERPRET=0  # compiled kernels (tests/conftest.py would turn the interpreter on)
# compile only for the GPU at hand (FlashInfer's JIT, any torch extension)
ARCH=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo "")
[ -n "$ARCH" ] && export FLASHINFER_CUDA_ARCH_LIST="$ARCH" TORCH_CUDA_ARCH_LIST="$ARCH"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
SETUP_PROBLEMS=()
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" .whl/*.whl || SETUP_PROBLEMS+=("installing the carried wheels failed")
else
  SETUP_PROBLEMS+=("no .whl/ (run scripts/gpu_stage.sh and carry .whl)")
fi
export PYTHONPATH="$WORK/site:$REPO/runtime/src:$REPO/operator/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$PY" - <<'EOF' || SETUP_PROBLEMS+=("the runtime does not import")
import importlib, torch
versions = {}
for name in ("torch", "triton", "flashinfer", "transformers", "fastapi", "zmq"):
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as err:  # noqa: BLE001
        versions[name] = f"missing ({type(err).__name__}: {err})"
print("versions:", versions, "cuda:", torch.version.cuda, "gpu:",
      torch.cuda.get_device_name() if torch.cuda.is_available() else "none")
import sluice.runtime.engine.model_worker  # noqa: F401  the runtime imports
EOF

MODEL=${SLUICE_GPU_MODEL:-}
if [ -z "$MODEL" ] || [ ! -f "$MODEL/config.json" ]; then
  MODEL="$WORK/smollm2-random"
  "$PY" scripts/gpu_prepare_model.py .gpu-model/smollm2 "$MODEL" \
    || SETUP_PROBLEMS+=("no model (carry .gpu-model from scripts/gpu_stage.sh, or set SLUICE_GPU_MODEL)")
  MODEL_KIND="SmolLM2-shaped, random weights"
else
  MODEL_KIND="$MODEL"
fi
export SLUICE_GPU_MODEL="$MODEL" SLUICE_GPU_RESULTS="$WORK"
if [ ${#SETUP_PROBLEMS[@]} -eq 0 ]; then
  summary "setup: PASS ($(( $(date +%s) - START ))s) model: $MODEL_KIND"
else
  summary "setup: FAIL ($(( $(date +%s) - START ))s) $(IFS=';'; echo "${SETUP_PROBLEMS[*]}"); model: $MODEL_KIND"
fi

# --- checks -----------------------------------------------------------------------------
pytest_step kernels 170 tests/gpu/test_gpu_kernels.py
pytest_step moe 60 tests/gpu/test_gpu_moe.py
pytest_step model 110 tests/gpu/test_gpu_model.py
pytest_step sampling 70 tests/gpu/test_gpu_sampling.py
pytest_step overlap 60 tests/gpu/test_gpu_overlap.py

for backend in flashinfer triton; do
  name="decode_$backend"
  if run_step "$name" 50 "$PY" -m benchmarks.decode_step --model "$MODEL" --backend "$backend" \
      --batch-sizes 1,8,32,64,128,160 --context-len 512 --output-file "$WORK/$name.json"; then
    if [ "$STEP_RC" -eq 0 ]; then
      summary "$name: PASS (${STEP_S}s) $("$PY" -c "
import json; d = json.load(open('$WORK/$name.json'))
print('; '.join(f\"bs {r['batch_size']}: eager {r['eager_ms']:.2f} ms, graph {r['graph_ms']:.2f} ms\" for r in d['steps']))")"
    else
      summary "$name: FAIL (${STEP_S}s) rc $STEP_RC"
    fi
  else
    summary "$name: SKIPPED (out of time)"
  fi
done

if run_step serving 170 "$PY" -m benchmarks.bench_serving --launch-server --model "$MODEL" \
    --num-prompts 64 --random-input-len 512 --random-output-len 256 --random-range-ratio 0.25 \
    --peer-device cuda --server-timeout 150 --output-file "$OUT/bench_serving.json"; then
  cp "$(grep -o 'server log: .*' "$WORK/serving.log" | head -1 | cut -d' ' -f3)" \
     "$OUT/bench_server.log" 2>/dev/null || true
  if [ "$STEP_RC" -eq 0 ] && [ -f "$OUT/bench_serving.json" ]; then
    summary "serving: PASS (${STEP_S}s) $("$PY" -c "
import json; d = json.load(open('$OUT/bench_serving.json'))
s, p, r = d['sluice'], d['peer'] or {}, d['ratios'] or {}
print(f\"sluice {s['output_throughput']:.0f} output tok/s, peer {p.get('output_throughput', 0):.0f}, \"
      f\"ratio {r.get('output_throughput_sluice_over_peer', 0):.2f}x; mean TTFT {s['mean_ttft_ms']:.0f} ms, \"
      f\"mean ITL {s['mean_itl_ms']:.1f} ms\")")"
  else
    summary "serving: FAIL (${STEP_S}s) rc $STEP_RC"
  fi
else
  summary "serving: SKIPPED (out of time)"
fi

# --- summary ----------------------------------------------------------------------------
"$PY" - "$WORK" "$OUT/summary.json" <<'EOF'
import glob, json, os, sys
work, target = sys.argv[1], sys.argv[2]
doc = {"checks": open(os.path.join(work, "summary.txt")).read().splitlines(), "results": {}}
for path in sorted(glob.glob(os.path.join(work, "*.json"))):
    doc["results"][os.path.basename(path)[:-5]] = json.load(open(path))
json.dump(doc, open(target, "w"), indent=1)
EOF
echo
echo "=== GPU check summary ($(( $(date +%s) - START ))s)"
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q ": FAIL"
