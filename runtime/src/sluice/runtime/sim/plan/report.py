"""What `sluice plan` reports per policy: SLO attainment, latency, replica-hours, scale events."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.runtime.sim.plan.fleet import FleetResult


@dataclass(frozen=True)
class Slo:
    ttft_s: float
    itl_s: float  # a request meets it when its mean gap between tokens is at most this


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarize(result: FleetResult, slo: Slo, arrivals: int) -> dict[str, Any]:
    failed = set(result.failed)
    ttfts: list[float] = []
    gaps: list[float] = []
    e2es: list[float] = []
    ok_ttft = ok_itl = ok_both = 0
    completed = 0
    for tr in result.traces:
        if tr.rid in failed or tr.finished_at is None or tr.ttft is None:
            continue
        completed += 1
        ttft = tr.ttft
        itl = tr.itl
        mean_itl = (sum(itl) / len(itl)) if itl else 0.0
        ttfts.append(ttft)
        gaps.extend(itl)
        e2es.append(tr.e2e or 0.0)
        a, b = ttft <= slo.ttft_s, mean_itl <= slo.itl_s
        ok_ttft += a
        ok_itl += b
        ok_both += a and b
    # pod-hours: a P/D replica is two pods
    hours = result.pods_per_replica * sum(
        ((p.gone_at if p.gone_at is not None else result.end) - p.created) / 3600.0 for p in result.pods
    )
    ups = sum(1 for e in result.scale_events if e.after > e.before)
    n = max(arrivals, 1)
    return {
        "policy": result.policy.name,
        "requests": arrivals,
        "completed": completed,
        "failed": arrivals - completed,
        "slo_attainment": ok_both / n,
        "ttft_attainment": ok_ttft / n,
        "itl_attainment": ok_itl / n,
        "mean_ttft_ms": 1000 * float(np.mean(ttfts)) if ttfts else None,
        "p50_ttft_ms": 1000 * _pct(ttfts, 50) if ttfts else None,
        "p99_ttft_ms": 1000 * _pct(ttfts, 99) if ttfts else None,
        "mean_itl_ms": 1000 * float(np.mean(gaps)) if gaps else None,
        "p99_itl_ms": 1000 * _pct(gaps, 99) if gaps else None,
        "mean_e2e_ms": 1000 * float(np.mean(e2es)) if e2es else None,
        "replica_hours": hours,
        "mean_replicas": hours * 3600.0 / result.end if result.end > 0 else None,
        "max_pods": max((int(m["pods"]) for m in result.timeline), default=0),
        "scale_events": len(result.scale_events),
        "scale_ups": ups,
        "scale_downs": len(result.scale_events) - ups,
        "simulated_ticks": result.ticks,
    }


def format_table(rows: list[dict[str, Any]], slo: Slo) -> str:
    head = (f"{'policy':<36} {'SLO met':>8} {'TTFT ok':>8} {'ITL ok':>7} {'p99 TTFT':>10} "
            f"{'mean ITL':>9} {'rep-hours':>10} {'scale ev':>9} {'failed':>7}")  # fmt: skip
    lines = [f"SLO: TTFT <= {slo.ttft_s:g} s and mean ITL <= {1000 * slo.itl_s:g} ms per request", head,
             "-" * len(head)]  # fmt: skip
    for r in rows:
        p99 = "n/a" if r["p99_ttft_ms"] is None else f"{r['p99_ttft_ms'] / 1000:.2f} s"
        itl = "n/a" if r["mean_itl_ms"] is None else f"{r['mean_itl_ms']:.0f} ms"
        lines.append(
            f"{r['policy']:<36} {r['slo_attainment']:>8.1%} {r['ttft_attainment']:>8.1%} "
            f"{r['itl_attainment']:>7.1%} {p99:>10} {itl:>9} {r['replica_hours']:>10.2f} "
            f"{r['scale_events']:>9} {r['failed']:>7}"
        )
    return "\n".join(lines)
