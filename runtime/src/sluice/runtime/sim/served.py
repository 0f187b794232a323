"""The calibration's served phase: `sluice serve` launched with the calibration's flags and
a schedule trace, driven over HTTP by the benchmark's own streaming client, to measure what
the scheduler alone does not show (`cost_model.ServingCost`):

1. single requests of several prompt lengths, each sent to an idle server: the hand-over
   (the client's send to the scheduler's inbox, from the trace's arrival) as a line in the
   prompt's tokens, and the return (the forward that sampled the first token to the
   client's first chunk);
2. bursts of short prompts with streamed outputs at several batch sizes: each tick's
   length in the trace against the in-process cost model's tick, fitted as
   `(scale - 1) * forward + tick_s + per_sampled_row_s * sampled rows`.

The requests are random token text (the workload's own generator), on a random stream of
their own; nothing here is a workload `sim_accuracy` runs.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sluice.runtime.distributed.topology import free_port
from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.scheduler.schedule_trace import read_trace
from sluice.runtime.sim.cost_model import LoopCost, ServingCost
from sluice.runtime.sim.nnls import nnls
from sluice.runtime.workload import client, dataset
from sluice.runtime.workload.server import launched_server, serve_command

SINGLE_PROMPT_LENS = (16, 128, 512, 1024, 2048)
BURST_SIZES = (8, 32, 64)
BURST_PROMPT_LEN = 64
BURST_OUTPUT_LEN = 48
SERVER_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SentRequest:
    phase: str  # "single" | "burst-N"
    prompt_tokens: int
    sent: float  # monotonic
    first_chunk: float | None  # monotonic
    done: float  # monotonic


def _plan(
    tokenizer: Any, context_len: int, max_rows: int, scale: float, seed: int
) -> list[tuple[str, list[dataset.BenchRequest]]]:
    rng = np.random.default_rng([seed, 7])
    pool = dataset.token_pool(tokenizer)

    def req(n: int, out: int) -> dataset.BenchRequest:
        return dataset.random_request(tokenizer, pool, n, out, rng)

    lens = sorted({min(max(8, int(n * scale)), context_len - 16) for n in SINGLE_PROMPT_LENS})
    # the first request: the server's first generation of a shape pays one-time costs
    phases: list[tuple[str, list[dataset.BenchRequest]]] = [("warm-up", [req(32, 4)])]
    phases += [("single", [req(n, 2)]) for n in lens]
    for b in sorted({min(b, max_rows) for b in BURST_SIZES}):
        phases.append((f"burst-{b}", [req(BURST_PROMPT_LEN, BURST_OUTPUT_LEN) for _ in range(b)]))
    return phases


async def _drive(
    base_url: str, phases: list[tuple[str, list[dataset.BenchRequest]]]
) -> list[SentRequest]:
    model = await client.fetch_model_id(base_url) or ""
    config = client.LoadConfig(url=base_url.rstrip("/") + client.COMPLETIONS_PATH, model=model)
    sent: list[SentRequest] = []
    async with client.http_client() as http:
        for phase, reqs in phases:
            results = await asyncio.gather(
                *(client.send_request(http, config, r, 0.0) for r in reqs)
            )
            for r, res in zip(reqs, results, strict=True):
                if not res.success:
                    raise RuntimeError(f"served phase: a request failed: {res.error}")
                # send_time is perf_counter (CLOCK_MONOTONIC, the trace's clock) with origin 0
                first = res.send_time + res.ttft if res.ttft else None
                sent.append(
                    SentRequest(phase, r.prompt_len, res.send_time, first, res.send_time + res.e2e)
                )
    return sent


@dataclass(frozen=True)
class ServedMeasurement:
    serving: ServingCost
    report: dict[str, Any]


def fit_serving(
    events: list[dict[str, Any]], sent: list[SentRequest], cost: LoopCost
) -> ServedMeasurement:
    """`ServingCost` from a served phase's trace and what its client saw."""
    arrivals = [e["t"] for e in events if e["event"] == "arrival"]
    forwards = [(e, BatchFeatures.from_record(e)) for e in events if e["event"] == "forward"]

    # 1. hand-over and return, from the single requests (the server idle before each)
    hand: list[tuple[int, float]] = []
    returns: list[float] = []
    for s in (s for s in sent if s.phase == "single"):
        arrived = next((t for t in arrivals if t >= s.sent), None)
        if arrived is None or arrived > s.done:
            raise RuntimeError("served phase: a request is missing from the schedule trace")
        hand.append((s.prompt_tokens, arrived - s.sent))
        first = next((e for e, f in forwards if e["submitted"] >= arrived and f.sampled_rows), None)
        if first is not None and s.first_chunk is not None:
            returns.append(s.first_chunk - first["end"])
    a = np.array([[1.0, n] for n, _ in hand])
    y = np.array([d for _, d in hand])
    hand_s, per_token = (float(c) for c in nnls(a, y))

    # 2. tick overheads, from consecutive ticks inside one burst
    rows: list[list[float]] = []
    target: list[float] = []
    ticks_model: list[float] = []
    for phase in sorted({s.phase for s in sent if s.phase.startswith("burst")}):
        mine = [s for s in sent if s.phase == phase]
        t0, t1 = min(s.sent for s in mine), max(s.done for s in mine)
        ticks = [(e, f) for e, f in forwards if t0 <= e["submitted"] <= t1]
        for (e, f), (nxt, _) in zip(ticks, ticks[1:], strict=False):
            interval = nxt["submitted"] - e["submitted"]
            model_fwd = cost.forward.predict(f)
            model_tick = cost.tick_seconds(f)
            rows.append([model_fwd, 1.0, float(f.sampled_rows)])
            target.append(interval - model_tick)
            ticks_model.append(model_tick)
    if len(rows) < 4:
        raise RuntimeError("served phase: too few ticks in the bursts to fit their overhead")
    m = np.array(rows)
    extra = np.array(target)
    w = 1.0 / np.maximum(np.array([r[0] for r in rows]) + 1e-3, 1e-3)  # relative to the tick's size
    scale_minus_one, tick_s, per_row = (float(c) for c in nnls(m * w[:, None], extra * w))
    serving = ServingCost(
        hand_over_s=hand_s,
        hand_over_per_token_s=per_token,
        return_s=statistics.median(returns) if returns else 0.0,
        forward_scale=1.0 + scale_minus_one,
        tick_s=tick_s,
        per_sampled_row_s=per_row,
    )
    real = np.array(ticks_model) + extra
    before = np.abs(extra) / real  # the scheduler's model alone against the served ticks
    residual = np.abs(m @ np.array([scale_minus_one, tick_s, per_row]) - extra) / real
    report = {
        "hand_over_ms": {str(n): 1000 * d for n, d in hand},
        "return_ms": [1000 * r for r in returns],
        "burst_ticks": len(rows),
        "tick_error_without_serving_mean": float(before.mean()),
        "tick_residual_mean": float(residual.mean()),
        "tick_residual_median": float(np.median(residual)),
    }
    return ServedMeasurement(serving, report)


def measure_serving(
    model: str,
    server_flags: list[str],
    tokenizer: Any,
    cost: LoopCost,
    context_len: int,
    max_rows: int,
    scale: float = 1.0,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> ServedMeasurement:
    """Launch `sluice serve --model MODEL SERVER_FLAGS` on a free port, run the served phase,
    stop it, and fit `ServingCost` against `cost` (the loop the server runs)."""
    base_url = f"http://127.0.0.1:{free_port()}"
    phases = _plan(tokenizer, context_len, max_rows, scale, seed)
    with tempfile.TemporaryDirectory(prefix="sluice-served-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        command = serve_command(
            model, base_url, " ".join([*server_flags, "--schedule-trace", str(trace)])
        )
        t0 = time.perf_counter()
        with launched_server(
            command,
            base_url,
            SERVER_START_TIMEOUT_S,
            grace_s=30.0,
            log_path=Path(tmp) / "server.log",
        ):
            started = time.perf_counter() - t0
            sent = asyncio.run(_drive(base_url, phases))
        events = list(read_trace(trace))
    measured = fit_serving(events, sent, cost)
    measured.report["server_start_s"] = started
    s = measured.serving
    log(f"served phase: hand-over {1000 * s.hand_over_s:.2f} ms + {1e6 * s.hand_over_per_token_s:.2f} us/token, "
        f"return {1000 * s.return_s:.2f} ms, forward x{s.forward_scale:.3f}, tick +{1000 * s.tick_s:.2f} ms "
        f"+ {1000 * s.per_sampled_row_s:.3f} ms per streamed token "
        f"(tick residual median {measured.report['tick_residual_median']:.1%})")  # fmt: skip
    return measured
