"""`sluice simulate`: `bench_serving`'s workload through the real scheduler on a virtual
clock, in seconds of wall time.

    sluice simulate --calibration calibration.json --output-file sim.json \\
        [bench_serving's workload flags] [sluice serve's scheduling flags]

The workload is `bench_serving`'s (the same `WorkloadArgs`, dataset code and seed: the same
prompts, lengths and arrivals), tokenized as the server tokenizes a completions prompt.
The results are computed by the benchmark's own `compute_metrics` and written under the
same keys (`output_throughput`, `mean_ttft_ms`, `p99_ttft_ms`, `mean_itl_ms`,
`mean_e2e_latency_ms`, ...), in the `sluice` section of the same document layout.
Deterministic: the same inputs give the same outputs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sluice.runtime.dataclass_cli import add_flags, option
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import COST_FLAGS, Calibration
from sluice.runtime.sim.pd import PDTopology
from sluice.runtime.sim.server_flags import SCHEDULING_FLAGS, add_server_flags, server_args_from
from sluice.runtime.workload.args import WorkloadArgs
from sluice.runtime.workload.metrics import strict_json

SIMULATE_SERVER_FLAGS = SCHEDULING_FLAGS + COST_FLAGS


@dataclass(frozen=True)
class SimulateArgs(WorkloadArgs, PDTopology):
    """The workload's flags (`WorkloadArgs`, shared with `bench_serving`), then the run's."""

    calibration: str = option("calibration.json", "The file `sluice calibrate` wrote.")
    output_file: str = option("", "Write the results as JSON here (bench_serving's layout).")
    output_details: bool = option(False, "Add every request's timings to the JSON.")
    model_path: str = option("", "Folder of the tokenizer (default: the calibration's model).")
    warmup_requests: int = option(1, "Short requests sent before the clock starts (as bench_serving).")
    allow_other_cpu: bool = option(
        False, "Simulate a CPU calibration measured on another CPU (it then predicts that "
        "machine, not this one).",
    )
    schedule_trace: str = option(
        "", "Write every request the simulated scheduler receives and every batch it launches "
        "here (JSON lines: `sluice serve --schedule-trace`'s layout, on the virtual clock).",
    )

    def validate(self) -> None:
        problems = self.workload_problems()
        if self.warmup_requests < 0:
            problems.append("--warmup-requests must be >= 0")
        problems += self.pd_problems()
        if self.pd_disaggregation and self.schedule_trace:
            problems.append("--schedule-trace traces one server: not with --pd-disaggregation")
        if problems:
            raise ValueError("; ".join(problems))


def add_parser_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SimulateArgs)
    add_server_flags(parser, SIMULATE_SERVER_FLAGS)


def simulation_server_args(ns: argparse.Namespace, calibration: Calibration) -> ServerArgs:
    """The scheduling flags as given; the cost flags must agree with the calibration."""
    # the flags' own defaults (an instance resolves the auto sizes: 0 would look "given")
    defaults = {f.name: f.default for f in dataclasses.fields(ServerArgs)}
    given = {n: getattr(ns, n) for n in COST_FLAGS if getattr(ns, n) != defaults[n]}
    mismatched = calibration.mismatched_flags(given)
    if mismatched:
        raise ValueError(
            "the calibration was measured with other engine flags: "
            + "; ".join(mismatched)
            + ". Run `sluice calibrate` with these flags."
        )
    if calibration.model.device != "cpu" and ns.cpu_kv_cache_gib != ServerArgs().cpu_kv_cache_gib:
        raise ValueError("--cpu-kv-cache-gib sizes the pool on the CPU; this calibration is for "
                         f"{calibration.model.device} (use --max-total-tokens)")  # fmt: skip
    # the simulator runs no model: cost flags stay at their defaults (validated on this host)
    return server_args_from(ns, SCHEDULING_FLAGS)


@dataclass(frozen=True)
class SimulationResult:
    document: dict[str, Any]
    wall_seconds: float
    simulated_seconds: float


def run_simulation(
    args: SimulateArgs, server_args: ServerArgs, calibration: Calibration, tokenizer: Any
) -> SimulationResult:
    from sluice.runtime.sim.client import ClientRequest, replay
    from sluice.runtime.sim.pd import SimPDPair
    from sluice.runtime.sim.replica import SimReplica
    from sluice.runtime.workload import dataset, metrics
    from sluice.runtime.workload.args import build_dataset
    from sluice.runtime.workload.arrivals import arrival_offsets

    began = time.perf_counter()
    requests, extras = build_dataset(args, tokenizer)
    summary = dataset.DatasetSummary.of(requests, **extras)
    offsets = arrival_offsets(len(requests), args.request_rate, args.seed)
    ignore_eos = not args.disable_ignore_eos
    replica: SimReplica | SimPDPair
    if (cost := args.transfer_cost(calibration.model.bytes_per_token)) is not None:
        replica = SimPDPair(server_args, calibration, cost)
    else:
        replica = SimReplica(server_args, calibration, trace_path=args.schedule_trace)
    if args.warmup_requests:  # off the clock, like bench_serving's warm-up
        warm = dataset.warmup_request(tokenizer, args.seed)
        ids = tokenizer.encode(warm.prompt, add_special_tokens=True)
        warmups = [ClientRequest(f"warmup-{i}", ids, warm.output_len, 0.0, ignore_eos)
                   for i in range(args.warmup_requests)]  # fmt: skip
        replay(replica, warmups, replica.clock.now)
    start = replica.clock.now
    client = [
        ClientRequest(f"bench-{i}", tokenizer.encode(r.prompt, add_special_tokens=True),
                      r.output_len, off, ignore_eos)
        for i, (r, off) in enumerate(zip(requests, offsets, strict=True))
    ]  # fmt: skip
    sent = replay(replica, client, start, args.max_concurrency)
    results = []
    for i, r in enumerate(requests):
        trace = replica.traces[f"bench-{i}"]
        ok = trace.finished_at is not None and trace.finish_reason != "abort" and trace.emissions
        results.append(metrics.RequestResult(
            prompt_len=r.prompt_len,
            output_len=r.output_len,
            success=bool(ok),
            output_tokens=trace.output_tokens,
            ttft=trace.ttft or 0.0,
            itl=tuple(trace.itl),
            e2e=trace.e2e or 0.0,
            send_time=sent[trace.rid] - start,
            usage_reported=True,
            server_prompt_tokens=trace.prompt_len,
            cached_tokens=trace.cached_tokens,
            error="" if ok else f"finished with {trace.finish_reason or 'nothing'}",
        ))  # fmt: skip
    end = max((t.finished_at or start) for t in replica.traces.values())
    simulated = max(end - start, 1e-9)
    served = metrics.compute_metrics(results, simulated)
    wall = time.perf_counter() - began
    stats = replica.stats()
    doc: dict[str, Any] = {
        "config": {**strict_json(dataclasses.asdict(args)), "server_args": _server_flags(server_args)},
        "dataset": asdict(summary),
        "sluice": {**served.to_dict(), "server_peak_rss_mib": None},
        "simulation": {
            "calibration": args.calibration,
            "loop": "overlap" if replica.overlap else "normal",
            "topology": "prefill+decode" if args.pd_disaggregation else "one server",
            "kv_pool_tokens": replica.pool.total_tokens,
            "ticks": replica.ticks,
            "retractions_total": stats.retractions_total,
            "prefill_batches_total": stats.prefill_batches_total,
            "decode_computed_prompt_tokens": (
                replica.decode.stats().computed_prompt_tokens_total
                if isinstance(replica, SimPDPair) else None
            ),
            "simulated_seconds": simulated,
            "wall_seconds": wall,
            "simulated_seconds_per_wall_second": simulated / wall if wall > 0 else None,
        },
        "notes": [
            "Simulated: the real scheduler on a virtual clock, each forward costed by the "
            "calibration's step-time model (no model ran).",
        ],
    }
    if args.output_details:
        doc["requests"] = [asdict(r) for r in results]
    if replica.trace is not None:
        replica.trace.close()
    return SimulationResult(strict_json(doc), wall, simulated)


def _server_flags(args: ServerArgs) -> dict[str, Any]:
    return {name: getattr(args, name) for name in SCHEDULING_FLAGS}




def format_summary(doc: dict[str, Any]) -> str:
    s, sim = doc["sluice"], doc["simulation"]

    def ms(key: str) -> str:
        v = s.get(key)
        return "n/a" if v is None else f"{v:.1f}"

    return "\n".join([
        f"simulated {s['completed']} requests ({s['failed']} failed) in {sim['simulated_seconds']:.1f} s "
        f"of virtual time, {sim['wall_seconds']:.2f} s of wall time "
        f"({sim['simulated_seconds_per_wall_second']:.0f} simulated s per wall s), "
        f"{sim['ticks']} ticks, {sim['retractions_total']} retractions",
        f"output throughput {s['output_throughput']:.1f} tok/s, request throughput "
        f"{s['request_throughput']:.2f} req/s",
        f"TTFT mean {ms('mean_ttft_ms')} ms, p99 {ms('p99_ttft_ms')} ms; ITL mean {ms('mean_itl_ms')} ms, "
        f"p99 {ms('p99_itl_ms')} ms; E2E mean {ms('mean_e2e_latency_ms')} ms, p99 {ms('p99_e2e_latency_ms')} ms",
    ])  # fmt: skip


def main(ns: argparse.Namespace) -> int:
    try:
        args = SimulateArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(SimulateArgs)})
        args.validate()
        calibration = Calibration.load(Path(args.calibration))
        refused = None if args.allow_other_cpu else calibration.other_cpu()
        refused = refused or (calibration.other_model(args.model_path) if args.model_path else None)
        if refused:
            raise ValueError(refused)
        server_args = simulation_server_args(ns, calibration)
    except ValueError as err:
        print(f"sluice simulate: {err}", file=sys.stderr)
        return 2
    from sluice.runtime.model.loader import load_tokenizer

    model_path = Path(args.model_path or calibration.model.path)
    if not (model_path / "tokenizer.json").is_file() and not (model_path / "tokenizer_config.json").is_file():
        print(f"sluice simulate: no tokenizer in {model_path}; pass --model-path", file=sys.stderr)
        return 2
    result = run_simulation(args, server_args, calibration, load_tokenizer(model_path))
    print(format_summary(result.document))
    if args.output_file:
        path = Path(args.output_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result.document, indent=2, allow_nan=False) + "\n")
        print(f"results written to {args.output_file}")
    return 0 if result.document["sluice"]["failed"] == 0 else 1
