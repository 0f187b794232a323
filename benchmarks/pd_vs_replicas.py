"""P/D against plain replicas, same machine, same workload, same run.

    python -m benchmarks.pd_vs_replicas [--runs 2] [--output-file pd.json] [bench_serving's
        workload flags, default: the long-prompt/short-answer mix below, sent at once]

Two topologies of two servers each, every server with `--torch-threads 1` (two servers on
the machine's cores either way), behind `sluice router`:

- `replicas`: two plain servers, the cache-aware router;
- `pd`: a prefill server and a decode server, the P/D router (`--pd-disaggregation`);
- `pd-2048`: the same with `--max-prefill-tokens 2048` on the prefill server. A prefill
  server never decodes, so every tick may prefill `--max-prefill-tokens` (8192) tokens: a
  burst's prompts go in one long forward and all get their first token at its end; a
  plain server that is decoding prefills at most a chunk (2048) per tick beside it.

Each run launches one topology, waits for a load under 0.5, sends bench_serving's workload
(its own client, dataset code and metrics) to the router, and stops it; the topologies
alternate (replicas, pd, pd-2048, replicas, ...), so a drift in the machine hits all. Prints
TTFT, inter-token latency p50/p99 and throughput per run. `SLUICE_QUIET_LOAD` changes the
load it waits for (a smoke run on a busy machine; its numbers are then not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_serving import BenchArgs, resolve_model_path, run_serving
from benchmarks.serving.router import router_command, wait_all_healthy
from benchmarks.serving.server import launched_server, serve_command
from sluice.runtime import constants as C
from sluice.runtime.workload import dataset, metrics
from sluice.runtime.workload.args import build_dataset

WORKLOAD = ["--dataset-name", "long-short", "--num-prompts", "32", "--request-rate", "inf",
            "--random-input-len", "2000", "--random-input-min", "128", "--random-output-len", "128",
            "--random-output-min", "16", "--random-range-ratio", "0.5", "--long-fraction", "0.25",
            "--seed", "7"]  # fmt: skip
SERVER_FLAGS = "--dtype bfloat16 --torch-threads 1 --max-total-tokens 32768"
TOPOLOGIES = ("replicas", "pd", "pd-2048")
BASE_PORT = 31400
QUIET_LOAD = float(os.environ.get("SLUICE_QUIET_LOAD", "0.5"))


def wait_quiet(limit_s: float = 600.0) -> float:
    """Wait until the 1-minute load average is under QUIET_LOAD; returns it."""
    deadline = time.monotonic() + limit_s
    while (load := os.getloadavg()[0]) >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    return load


@contextlib.contextmanager
def topology(kind: str, model: str, timeout_s: float = 300.0) -> Iterator[str]:
    """The topology up until the block ends; yields the router's URL."""
    router = f"http://127.0.0.1:{BASE_PORT}"
    a, b = (f"http://127.0.0.1:{BASE_PORT + i}" for i in (1, 2))
    with contextlib.ExitStack() as stack:
        if kind == "replicas":
            for url in (a, b):
                stack.enter_context(
                    launched_server(serve_command(model, url, SERVER_FLAGS), url, timeout_s)
                )
            command = router_command(router, [a, b], "cache-aware", [])
        else:
            bootstrap = BASE_PORT + 3
            prefill = f"{SERVER_FLAGS} --disaggregation-mode prefill --disaggregation-bootstrap-port {bootstrap}"
            if kind == "pd-2048":
                prefill += " --max-prefill-tokens 2048"
            decode = f"{SERVER_FLAGS} --disaggregation-mode decode"
            stack.enter_context(launched_server(serve_command(model, a, prefill), a, timeout_s))
            stack.enter_context(launched_server(serve_command(model, b, decode), b, timeout_s))
            command = [sys.executable, "-m", "sluice.runtime", "router", "--host", "127.0.0.1",
                       "--port", str(BASE_PORT), C.FLAG_PD_DISAGGREGATION,
                       C.FLAG_PREFILL, a, str(bootstrap), C.FLAG_DECODE, b]  # fmt: skip
        stack.enter_context(launched_server(command, router, timeout_s, grace_s=10))
        wait_all_healthy(router, 2, timeout_s)  # P/D: /workers lists both pools
        yield router


def summary(served: metrics.ServingMetrics) -> dict[str, Any]:
    d = served.to_dict()
    keys = ("completed", "failed", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
            "median_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms")  # fmt: skip
    return {k: d.get(k) for k in keys}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="Runs of each topology (interleaved).")
    parser.add_argument("--output-file", default="", help="Write every run's numbers here (JSON).")
    ours, rest = parser.parse_known_args(argv)
    args = BenchArgs.from_cli([*WORKLOAD, *rest, "--base-url", f"http://127.0.0.1:{BASE_PORT}"])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(args))
    requests, _ = build_dataset(args, tokenizer)
    warmup = dataset.warmup_request(tokenizer, args.seed)
    rows = []
    for run in range(ours.runs):
        for kind in TOPOLOGIES:
            with topology(kind, args.model):
                load = wait_quiet()
                results, duration = asyncio.run(run_serving(args, requests, warmup))
            row = {"topology": kind, "run": run + 1, "load_before": round(load, 2),
                   **summary(metrics.compute_metrics(results, duration))}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'topology':<9} {'run':>3} {'tok/s':>7} {'TTFT mean':>10} {'TTFT p99':>9} "
          f"{'ITL p50':>8} {'ITL p99':>8} {'E2E mean':>9} {'load':>5}")  # fmt: skip
    for r in rows:
        print(f"{r['topology']:<9} {r['run']:>3} {r['output_throughput']:>7.1f} {r['mean_ttft_ms']:>10.0f} "
              f"{r['p99_ttft_ms']:>9.0f} {r['median_itl_ms']:>8.1f} {r['p99_itl_ms']:>8.1f} "
              f"{r['mean_e2e_latency_ms']:>9.0f} {r['load_before']:>5.2f}")  # fmt: skip
    if ours.output_file:
        Path(ours.output_file).write_text(
            json.dumps({"workload": args.to_dict(), "runs": rows}, indent=2) + "\n"
        )
    return 0 if all(r["failed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
