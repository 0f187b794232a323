"""A real server's schedule trace against the simulator's on the same arrivals
(`sluice serve --schedule-trace` and `sluice simulate --schedule-trace`, one layout:
`scheduler.schedule_trace`), tick by tick: where the simulated clock runs ahead or behind,
and which term of the model it is.

    python -m sluice.runtime.sim.trace_compare REAL.jsonl SIM.jsonl --calibration C.json

Both traces are read from the first request after the warm-ups (a server's trace starts
with its own warm-up generation and `bench_serving`'s warm-up request, the simulator's with
the latter only: `--real-warmup 2`, `--sim-warmup 1`), each on its own clock with that
arrival at 0.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.scheduler.schedule_trace import read_trace
from sluice.runtime.sim.cost_model import LoopCost

KINDS = ("decode", "prefill", "mixed")
REAL_WARMUPS = 2  # the server's own warm-up generation, then bench_serving's warm-up request
SIM_WARMUPS = 1  # bench_serving's, as `sluice simulate` replays it


@dataclass(frozen=True)
class Forward:
    submitted: float
    end: float
    seconds: float
    features: BatchFeatures
    rows: tuple[tuple[int, int, int], ...] = ()  # (row, start, length) of each request row

    def continued_by(self, nxt: Forward) -> bool:
        """Whether `nxt` computes the next position of a request this one computed (so the
        scheduler was busy between them, not idle)."""
        ends = {row: start + length for row, start, length in self.rows}
        return any(ends.get(row) == start for row, start, _ in nxt.rows)

    @property
    def kind(self) -> str:
        f = self.features
        if f.prefill_rows == 0:
            return "decode"
        return "prefill" if f.decode_rows == 0 else "mixed"


@dataclass(frozen=True)
class Trace:
    arrivals: list[tuple[float, int]]  # (t, prompt tokens), from the first request at 0
    handed: list[float]  # when the API server handed each over (same origin)
    forwards: list[Forward]

    @classmethod
    def read(cls, path: str | Path, warmup: int = 1) -> Trace:
        events = list(read_trace(path))
        arrivals = [e for e in events if e["event"] == "arrival"][warmup:]
        if not arrivals:
            raise ValueError(f"{path}: no arrivals after the {warmup} warm-up request(s)")
        t0 = arrivals[0]["t"]
        forwards = [
            Forward(e["submitted"] - t0, e["end"] - t0, e["seconds"],
                    BatchFeatures.from_record(e), tuple((r[0], r[1], r[2]) for r in e["rows"]))
            for e in events if e["event"] == "forward" and e["end"] >= t0
        ]  # fmt: skip
        return cls([(a["t"] - t0, a["prompt_tokens"]) for a in arrivals],
                   [a.get("handed", a["t"]) - t0 for a in arrivals], forwards)  # fmt: skip

    @property
    def span(self) -> float:
        return self.forwards[-1].end if self.forwards else 0.0

    def intervals(self) -> list[float | None]:
        """Each tick's length, its launch to the next one's, where the next one continues a
        request of this one; None where the scheduler may have gone idle in
        between (the next tick only starts new requests) and for the last tick."""
        f = self.forwards
        return [b.submitted - a.submitted if a.continued_by(b) else None
                for a, b in zip(f, f[1:], strict=False)] + ([None] if f else [])  # fmt: skip


def _mean(xs: list[float | None]) -> float:
    known = [x for x in xs if x is not None]
    return statistics.fmean(known) if known else 0.0


def compare(real: Trace, sim: Trace, cost: LoopCost | None = None) -> dict[str, Any]:
    """The numbers `format_comparison` prints: arrivals, ticks by kind (count, forward
    seconds, tick length, the cost model's forward on the real ticks), and the first tick
    where the two schedules part."""
    out: dict[str, Any] = {}
    for name, tr in (("real", real), ("sim", sim)):
        gaps = [b[0] - a[0] for a, b in zip(tr.arrivals, tr.arrivals[1:], strict=False)]
        out[name] = {
            "requests": len(tr.arrivals),
            "arrival_spread_s": tr.arrivals[-1][0] - tr.arrivals[0][0],
            "handed_spread_s": max(tr.handed) - min(tr.handed),
            "median_arrival_gap_ms": 1000 * statistics.median(gaps) if gaps else 0.0,
            "ticks": len(tr.forwards),
            "span_s": tr.span,
            "forward_s": sum(f.seconds for f in tr.forwards),
            "by_kind": {},
        }
        ivals = tr.intervals()
        for kind in KINDS:
            idx = [i for i, f in enumerate(tr.forwards) if f.kind == kind]
            entry = {
                "ticks": len(idx),
                "mean_forward_ms": 1000 * _mean([tr.forwards[i].seconds for i in idx]),
                "mean_tick_ms": 1000 * _mean([ivals[i] for i in idx]),
                "tokens": sum(tr.forwards[i].features.tokens for i in idx),
            }
            if cost is not None and name == "real" and idx:
                ratios = [tr.forwards[i].seconds / max(cost.forward.predict(tr.forwards[i].features), 1e-9)
                          for i in idx]  # fmt: skip
                host = [v - tr.forwards[i].seconds if (v := ivals[i]) is not None else None for i in idx]
                model_host = [cost.host_schedule.predict(tr.forwards[i].features)
                              + cost.host_process.predict(tr.forwards[i].features)
                              if ivals[i] is not None else None for i in idx]  # fmt: skip
                entry["real_over_model_forward"] = statistics.median(ratios)
                entry["mean_host_ms"] = 1000 * _mean(host)
                entry["model_host_ms"] = 1000 * _mean(model_host)
            out[name]["by_kind"][kind] = entry
    same = 0
    for a, b in zip(real.forwards, sim.forwards, strict=False):
        if (a.features.decode_rows, a.features.prefill_tokens) != (
            b.features.decode_rows,
            b.features.prefill_tokens,
        ):
            break
        same += 1
    out["same_batches_from_start"] = same
    return out


def format_comparison(c: dict[str, Any]) -> str:
    r, s = c["real"], c["sim"]
    lines = [
        f"requests {r['requests']}; handed over within {1000 * r['handed_spread_s']:.1f} ms real, "
        f"{1000 * s['handed_spread_s']:.1f} ms simulated; taken in by the scheduler over "
        f"{1000 * r['arrival_spread_s']:.1f} / {1000 * s['arrival_spread_s']:.1f} ms (median gap "
        f"{r['median_arrival_gap_ms']:.2f} / {s['median_arrival_gap_ms']:.2f} ms)",
        f"ticks {r['ticks']} / {s['ticks']}; busy span {r['span_s']:.2f} / {s['span_s']:.2f} s; forward time "
        f"{r['forward_s']:.2f} / {s['forward_s']:.2f} s; identical batches from the start: "
        f"{c['same_batches_from_start']}",
        "| ticks | real n / sim n | forward ms real / sim | tick ms real / sim | real forward / model "
        "| host ms real / model |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        a, b = r["by_kind"][kind], s["by_kind"][kind]
        ratio = f"{a['real_over_model_forward']:.2f}" if "real_over_model_forward" in a else "n/a"
        host = (
            f"{a['mean_host_ms']:.1f} / {a['model_host_ms']:.1f}" if "mean_host_ms" in a else "n/a"
        )
        lines.append(f"| {kind} | {a['ticks']} / {b['ticks']} | {a['mean_forward_ms']:.1f} / "
                     f"{b['mean_forward_ms']:.1f} | {a['mean_tick_ms']:.1f} / {b['mean_tick_ms']:.1f} | "
                     f"{ratio} | {host} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("real")
    p.add_argument("sim")
    p.add_argument("--calibration", default="", help="also put the cost model on the real ticks")
    p.add_argument(
        "--overlap", action="store_true", help="the overlap loop's costs (default: normal)"
    )
    p.add_argument(
        "--real-warmup",
        type=int,
        default=REAL_WARMUPS,
        help="warm-up requests the server's trace starts with",
    )
    p.add_argument(
        "--sim-warmup",
        type=int,
        default=SIM_WARMUPS,
        help="warm-up requests the simulator's trace starts with",
    )
    ns = p.parse_args(argv)
    cost = None
    if ns.calibration:
        from sluice.runtime.sim.calibration import Calibration

        cost = Calibration.load(Path(ns.calibration)).costs.loop(ns.overlap)
    try:
        result = compare(
            Trace.read(ns.real, ns.real_warmup), Trace.read(ns.sim, ns.sim_warmup), cost
        )
    except ValueError as err:
        print(f"trace_compare: {err}", file=sys.stderr)
        return 2
    print(format_comparison(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
