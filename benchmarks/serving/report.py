"""The printed table (laid out like SGLang's) and the JSON document of one run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.serving.dataset import DatasetSummary
from benchmarks.serving.metrics import LatencySummary, PeerMetrics, RequestResult, ServingMetrics
from sluice.runtime.workload.metrics import strict_json

WIDTH = 50


def _heading(title: str, fill: str) -> str:
    return f"{' ' + title + ' ' if fill == '=' else title:{fill}^{WIDTH}}"


def _row(label: str, value: object) -> str:
    if value is None:
        text = "n/a"
    elif isinstance(value, float):
        text = "inf" if math.isinf(value) else f"{value:.2f}"
    else:
        text = str(value)
    return f"{label:<40} {text:<10}"


def _latency_rows(title: str, name: str, summary: LatencySummary | None) -> list[str]:
    return [
        _heading(title, "-"),
        _row(f"Mean {name} (ms):", summary.mean_ms if summary else None),
        _row(f"Median {name} (ms):", summary.median_ms if summary else None),
        _row(f"P99 {name} (ms):", summary.p99_ms if summary else None),
    ]


def format_dataset(name: str, summary: DatasetSummary) -> str:
    lines = [
        _heading(f"Dataset: {name}", "="),
        _row("Requests:", summary.num_requests),
        _row("Input tokens (total):", summary.total_input_tokens),
        _row(
            "Input tokens (min/mean/max):",
            f"{summary.input_len_min}/{summary.input_len_mean:.0f}/{summary.input_len_max}",
        ),
        _row("Output tokens asked (total):", summary.total_output_tokens),
        _row(
            "Output tokens (min/mean/max):",
            f"{summary.output_len_min}/{summary.output_len_mean:.0f}/{summary.output_len_max}",
        ),
    ]
    if summary.shared_prefix_tokens is not None:
        lines.append(_row("Shared prefix tokens:", summary.shared_prefix_tokens))
    if summary.ideal_cached_tokens is not None:
        lines.append(_row("Ideal cached prompt tokens:", summary.ideal_cached_tokens))
    return "\n".join(lines)


def format_serving(
    m: ServingMetrics,
    backend: str,
    request_rate: float,
    max_concurrency: int,
    server_peak_rss_mib: float | None,
) -> str:
    lines = [
        _heading("Serving Benchmark Result", "="),
        _row("Backend:", backend),
        _row("Traffic request rate:", request_rate),
        _row("Max request concurrency:", max_concurrency or "not set"),
        _row("Successful requests:", m.completed),
        _row("Failed requests:", m.failed),
        _row("Benchmark duration (s):", m.duration_s),
        _row("Total input tokens:", m.total_input_tokens),
        _row("Total generated tokens:", m.total_output_tokens),
        _row("Request throughput (req/s):", m.request_throughput),
        _row("Input token throughput (tok/s):", m.input_throughput),
        _row("Output token throughput (tok/s):", m.output_throughput),
        _row("Total token throughput (tok/s):", m.total_throughput),
        _row("Mean concurrency:", m.mean_concurrency),
        _row("Peak concurrency:", m.peak_concurrency),
    ]
    if m.cached_tokens is not None:
        lines.append(_row("Cached prompt tokens (server):", m.cached_tokens))
    if server_peak_rss_mib is not None:
        lines.append(_row("Server peak RSS, all processes (MiB):", server_peak_rss_mib))
    lines += _latency_rows("End-to-End Latency", "E2E Latency", m.e2e)
    lines += _latency_rows("Time to First Token", "TTFT", m.ttft)
    lines += _latency_rows("Time per Output Token (excl. 1st token)", "TPOT", m.tpot)
    lines += _latency_rows("Inter-Token Latency", "ITL", m.itl)
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def format_peer(p: PeerMetrics, peak_rss_mib: float | None, title: str = "transformers generate") -> str:
    lines = [
        _heading(f"Peer: {title}", "="),
        _row("Batch size (sequences at once):", p.batch_size),
        _row("Successful requests:", p.completed),
        _row("Benchmark duration (s):", p.duration_s),
        _row("Total input tokens:", p.total_input_tokens),
        _row("Total generated tokens:", p.total_output_tokens),
        _row("Tokens computed incl. padded rows:", p.generated_tokens),
        _row("Request throughput (req/s):", p.request_throughput),
        _row("Output token throughput (tok/s):", p.output_throughput),
        _row("Total token throughput (tok/s):", p.total_throughput),
    ]
    if peak_rss_mib is not None:
        lines.append(_row("Benchmark process peak RSS (MiB):", peak_rss_mib))
    lines += _latency_rows("End-to-End Latency", "E2E Latency", p.e2e)
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.3g}x"


def format_comparison(ratios: dict[str, float | None]) -> str:
    return "\n".join(
        [
            _heading("Sluice / peer", "="),
            _row(
                "Output throughput (higher is better):",
                _ratio(ratios["output_throughput_sluice_over_peer"]),
            ),
            _row(
                "Mean E2E latency (lower is better):",
                _ratio(ratios["mean_e2e_sluice_over_peer"]),
            ),
            "=" * WIDTH,
        ]
    )


def format_comparisons(ratios: dict[str, dict[str, float | None]]) -> str:
    """Sluice over every peer that ran, and over the best of them."""
    lines = [_heading("Sluice / peers (output throughput: higher is better)", "=")]
    for name, r in ratios.items():
        lines.append(_row(f"Sluice / {name}:", _ratio(r["output_throughput_sluice_over_peer"])))
        lines.append(_row(f"  mean E2E, Sluice / {name}:", _ratio(r["mean_e2e_sluice_over_peer"])))
    known = [r["output_throughput_sluice_over_peer"] for r in ratios.values()]
    known = [r for r in known if r is not None]
    if known:
        lines.append(_row("Sluice / best peer:", _ratio(min(known))))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def format_ceilings(ceilings: Sequence[Any], total_tokens_per_s: float,
                    output_tokens_per_s: float) -> str:  # fmt: skip
    """GEMM ceilings (`benchmarks.serving.ceiling`) and the share of each Sluice's useful
    FLOPs reached (prompt tokens credited with the decoder only, output tokens with the LM
    head too)."""
    lines = [_heading("GEMM ceilings ([256x576]x[576x1536])", "=")]
    for c in ceilings:
        unit = "GOP/s" if c.dtype == "int8" else "GFLOP/s"
        share = c.fraction(total_tokens_per_s, output_tokens_per_s)
        lines.append(_row(f"{c.dtype} {unit}:", c.gflops))
        lines.append(_row(f"  {c.dtype} ceiling (generated tok/s):", c.tokens_per_s))
        lines.append(_row(f"  Sluice useful FLOP/s / {c.dtype}:", f"{share:.1%}"))
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def format_notes(notes: Sequence[str]) -> str:
    return "\n".join(["Notes:", *(f"- {n}" for n in notes)])




def result_document(
    config: dict[str, Any],
    dataset: DatasetSummary,
    sluice: ServingMetrics,
    server_peak_rss_mib: float | None,
    peer: PeerMetrics | None,
    peer_peak_rss_mib: float | None,
    ratios: dict[str, float | None] | None,
    notes: Sequence[str],
    details: Sequence[RequestResult] | None = None,
    *,
    peers: dict[str, dict[str, Any]] | None = None,
    all_ratios: dict[str, dict[str, float | None]] | None = None,
    ceilings: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`peer`/`ratios`: the best transformers peer (the headline comparison); `peers` and
    `all_ratios`: every peer that ran; `ceilings`: the GEMM ceilings."""
    doc: dict[str, Any] = {
        "config": config,
        "dataset": asdict(dataset),
        "sluice": {**sluice.to_dict(), "server_peak_rss_mib": server_peak_rss_mib},
        "peer": {**peer.to_dict(), "peak_rss_mib": peer_peak_rss_mib} if peer else None,
        "ratios": ratios,
        "peers": peers or {},
        "all_ratios": all_ratios or {},
        "gemm_ceilings": ceilings,
        "notes": list(notes),
    }
    if details is not None:
        doc["requests"] = [asdict(r) for r in details]
    return strict_json(doc)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")
