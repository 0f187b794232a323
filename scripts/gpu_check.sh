#!/usr/bin/env bash
# The GPU check: one call on an NVIDIA GPU machine (an H200 in mind; no network there).
#
#   here:   scripts/gpu_stage.sh   (wheels into .whl/, the bundled tokenizer into .gpu-model/)
#   there:  bash scripts/gpu_check.sh   with carry ['.whl', '.gpu-model'], timeout_s 540
#
# Serving and speed first, correctness second; each step has a cap, the caps add up to
# less than the budget (GPU_CHECK_BUDGET_S, 470 s: under 8 minutes, room for one rerun in
# a 15-minute lease). A step that fails, times out or is skipped is a FAIL, and any FAIL
# makes the exit status non-zero. Without CUDA it exits at once (status 3, one line).
#
#   setup        carried wheels; an 8B-shaped model (Llama-3.1-8B's layers, the bundled
#                tokenizer's vocabulary, random bf16 made on the GPU) and a SmolLM2-shaped
#                one for the tests; the scheduler and the server import (xgrammar too)
#   roofline     benchmarks/roofline.py on the 8B shape: decode step time at batch 1, 16,
#                64, 160 against (weight + KV bytes) / measured HBM bandwidth, prefill
#                against the measured bf16 matmul rate, CUDA graphs on and off, for each
#                backend in GPU_CHECK_BACKENDS (triton,flashinfer)
#   serving      sluice serve on the 8B shape, benchmarks/bench_serving at temperature 1.0
#                and 0 with the overlap loop, and 1.0 with the normal loop; the scheduler
#                thread's blocked time per step from the server log (blocked_time lines)
#   correctness  tests/gpu and the fused Triton kernels compiled (greedy equal across backends and to eager,
#                the shipped default: overlap + graphs + sampled rows)
#
# Under $OUT: gpu_check.log (everything), summary.json (the checks and every figure),
# roofline.json, serving_*.json, server_*.log.
#
#   bash scripts/gpu_check.sh --plan    # the steps and caps, no GPU needed
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PY:-python3}
BUDGET=${GPU_CHECK_BUDGET_S:-470}
# name:cap_seconds, in the order they run
STEPS=(setup:70 roofline:120 serving:170 correctness:100)

if [ "${1:-}" = "--plan" ]; then
  total=0
  for s in "${STEPS[@]}"; do echo "step ${s%%:*} cap ${s##*:}"; total=$(( total + ${s##*:} )); done
  echo "caps ${total} budget ${BUDGET}"
  exit 0
fi

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; then
  echo "gpu_check: FAIL no CUDA device here (torch.cuda.is_available() is false); nothing was checked" >&2
  exit 3
fi

OUT=${OUT:-$REPO/gpu-check-results}
WORK=$(mktemp -d /tmp/gpu-check.XXXX)
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
START=$(date +%s)
DEADLINE=$(( START + BUDGET ))
SUMMARY=()
STEP_END=0

cap_of() { for s in "${STEPS[@]}"; do [ "${s%%:*}" = "$1" ] && echo "${s##*:}"; done; }

summary() {
  local line="CHECK $*"
  SUMMARY+=("$line")
  echo "$line"
  printf '%s\n' "$line" >>"$WORK/summary.txt"
}

# begin_step NAME: its deadline is the smaller of its cap and the budget left
begin_step() {
  local cap left
  cap=$(cap_of "$1")
  left=$(( DEADLINE - $(date +%s) ))
  STEP_END=$(( $(date +%s) + (left < cap ? left : cap) ))
  STEP_T0=$(date +%s)
  echo "=== $1 (up to $(( STEP_END - STEP_T0 ))s)"
}
step_left() { echo $(( STEP_END - $(date +%s) )); }

# within_step COMMAND...: runs COMMAND until the step's deadline; 124 when it ran out
within_step() {
  local left
  left=$(step_left)
  [ "$left" -lt 5 ] && return 124
  timeout --kill-after=10 "$left" "$@"
}

export PYTHONUNBUFFERED=1
export TRITON_INTERPRET=0  # compiled kernels (tests/conftest.py would turn the interpreter on)
ARCH=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo "")
[ -n "$ARCH" ] && export FLASHINFER_CUDA_ARCH_LIST="$ARCH" TORCH_CUDA_ARCH_LIST="$ARCH"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
BACKENDS=${GPU_CHECK_BACKENDS:-triton,flashinfer}

# --- setup ------------------------------------------------------------------------------
begin_step setup
problems=()
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$WORK/site" .whl/*.whl || problems+=("installing the carried wheels failed")
else
  problems+=("no .whl/ (run scripts/gpu_stage.sh and carry .whl)")
fi
export PYTHONPATH="$WORK/site:$REPO/runtime/src:$REPO/operator/src:$REPO${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
MODEL="$WORK/llama8b-random" SMALL="$WORK/smollm2-random"
within_step "$PY" scripts/gpu_prepare_model.py .gpu-model/smollm2 "$MODEL" --shape llama-3.1-8b \
  || problems+=("no 8B-shaped model (carry .gpu-model from scripts/gpu_stage.sh)")
within_step "$PY" scripts/gpu_prepare_model.py .gpu-model/smollm2 "$SMALL" \
  || problems+=("no SmolLM2-shaped model")
within_step "$PY" - <<'EOF' || problems+=("the scheduler or the server does not import")
import importlib, torch
versions = {}
for name in ("torch", "triton", "flashinfer", "xgrammar", "transformers", "fastapi", "zmq"):
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "?")
    except Exception as err:  # noqa: BLE001
        versions[name] = f"missing ({type(err).__name__}: {err})"
print("versions:", versions, "cuda:", torch.version.cuda, "gpu:", torch.cuda.get_device_name())
import sluice.runtime.scheduler.process, sluice.runtime.entrypoints.http_server  # noqa: E401,F401
EOF
export SLUICE_GPU_MODEL="$SMALL" SLUICE_GPU_RESULTS="$WORK"
if [ ${#problems[@]} -eq 0 ]; then
  summary "setup: PASS ($(( $(date +%s) - STEP_T0 ))s) models: 8B-shaped and SmolLM2-shaped, random bf16"
else
  summary "setup: FAIL ($(( $(date +%s) - STEP_T0 ))s) $(IFS=';'; echo "${problems[*]}")"
fi

# --- roofline ---------------------------------------------------------------------------
begin_step roofline
within_step "$PY" -m benchmarks.roofline --model "$MODEL" --backends "$BACKENDS" \
  --batch-sizes 1,16,64,160 --context-len 1024 --output-file "$OUT/roofline.json"
rc=$?
if [ "$rc" -eq 0 ] && [ -f "$OUT/roofline.json" ]; then
  summary "roofline: PASS ($(( $(date +%s) - STEP_T0 ))s) $("$PY" -c "
import json; d = json.load(open('$OUT/roofline.json'))
print('; '.join(f\"{r['backend']} bs {r['batch_size']}: {r['graph_pct_of_roofline']:.0f}%\" for r in d['decode']))")"
elif [ "$rc" -eq 124 ]; then
  summary "roofline: FAIL timed out ($(( $(date +%s) - STEP_T0 ))s)"
else
  summary "roofline: FAIL rc $rc ($(( $(date +%s) - STEP_T0 ))s)"
fi

# --- serving ----------------------------------------------------------------------------
PORT=30123
serve() {  # NAME FLAGS...: start sluice serve in the background, wait for /health
  local name=$1
  shift
  "$PY" -m sluice.runtime serve --model "$MODEL" --port "$PORT" --max-context-len 4096 "$@" \
    >"$OUT/server_$name.log" 2>&1 &
  SERVER_PID=$!
  while [ "$(step_left)" -gt 5 ]; do
    "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" \
      >/dev/null 2>&1 && return 0
    kill -0 "$SERVER_PID" 2>/dev/null || return 1
    sleep 1
  done
  return 124
}
unserve() { kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; }
bench() {  # NAME TEMPERATURE: one bench_serving run against the server; the blocked time after
  local name=$1 temp=$2 before
  before=$(wc -l <"$OUT/server_${name%_t*}.log")
  within_step "$PY" -m benchmarks.bench_serving --base-url "http://127.0.0.1:$PORT" \
    --model "$MODEL" --model-path "$MODEL" --peer none --num-prompts 128 --random-input-len 512 \
    --random-output-len 320 --random-range-ratio 0.9 --extra-request-body "{\"temperature\": $temp}" \
    --output-file "$OUT/serving_$name.json" >"$WORK/bench_$name.log" 2>&1 \
    || { echo "$name: bench_serving failed: $(tail -3 "$WORK/bench_$name.log" | tr '\n' ' ')"; return 1; }
  sleep 0.5
  tail -n +"$before" "$OUT/server_${name%_t*}.log" | grep -o "blocked_time .*" | tail -1 >"$WORK/blocked_$name.txt"
  "$PY" -c "
import json; d = json.load(open('$OUT/serving_$name.json')); s = d.get('sluice', d)
b = open('$WORK/blocked_$name.txt').read().strip() or 'blocked_time: none logged'
print(f\"$name: {s['output_throughput']:.0f} output tok/s, mean TTFT {s['mean_ttft_ms']:.0f} ms, mean ITL {s['mean_itl_ms']:.1f} ms; {b}\")"
}
begin_step serving
serving_ok=1 notes=()
if serve overlap; then
  for t in 1.0 0; do
    note=$(bench "overlap_t$t" "$t") || serving_ok=0
    notes+=("$note")
  done
else
  serving_ok=0 notes+=("the overlap server did not start (server_overlap.log)")
fi
unserve
if [ "$(step_left)" -gt 30 ] && serve normal --disable-overlap-schedule; then
  note=$(bench "normal_t1.0" 1.0) || serving_ok=0
  notes+=("$note")
else
  serving_ok=0 notes+=("the normal-loop server did not start or no time was left")
fi
unserve
verdict=PASS
[ "$serving_ok" -eq 1 ] || verdict=FAIL
summary "serving: $verdict ($(( $(date +%s) - STEP_T0 ))s) $(IFS='|'; echo "${notes[*]}")"

# --- correctness ------------------------------------------------------------------------
begin_step correctness
within_step "$PY" -m pytest -q -p no:cacheprovider -o addopts= -rs --junitxml="$WORK/correctness.xml" \
  tests/gpu tests/kernels/test_triton_fused.py 2>&1 | tee "$WORK/correctness.log"
rc=${PIPESTATUS[0]}
result=$(grep -E "^(=+ )?[0-9]+ (passed|failed|error|skipped)" "$WORK/correctness.log" | tail -1 | tr -d '=')
verdict=PASS
[ "$rc" -ne 0 ] && verdict="FAIL rc $rc"
[ "$rc" -eq 124 ] && verdict="FAIL timed out"
grep -q "skipped" <<<"$result" && verdict="FAIL (a skipped test proves nothing)"
grep -q "passed" <<<"$result" || verdict="FAIL nothing passed"
summary "correctness: $verdict ($(( $(date +%s) - STEP_T0 ))s) ${result:-no pytest summary}"

# --- summary ----------------------------------------------------------------------------
"$PY" - "$WORK" "$OUT" <<'EOF'
import glob, json, os, sys
work, out = sys.argv[1], sys.argv[2]
doc = {"checks": open(os.path.join(work, "summary.txt")).read().splitlines(), "results": {}}
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    if not path.endswith("summary.json"):
        doc["results"][os.path.basename(path)[:-5]] = json.load(open(path))
for path in sorted(glob.glob(os.path.join(work, "blocked_*.txt"))):
    doc["results"][os.path.basename(path)[:-4]] = open(path).read().strip()
json.dump(doc, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
echo
echo "=== GPU check summary ($(( $(date +%s) - START ))s of ${BUDGET}s)"
printf '%s\n' "${SUMMARY[@]}"
! printf '%s\n' "${SUMMARY[@]}" | grep -q ": FAIL"
