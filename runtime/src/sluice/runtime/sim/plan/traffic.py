"""The traffic `sluice plan` replays: a request rate per minute (from a file, or generated:
diurnal, bursty), Poisson arrivals within each minute, and request shapes (prompt and
output lengths, shared prefixes) drawn like `bench_serving`'s random dataset, as token ids
(no tokenizer needed).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sluice.runtime.workload.dataset import sample_lengths

MINUTE = 60.0


@dataclass(frozen=True)
class RateTrace:
    """Requests per second, one value per minute."""

    per_minute: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.per_minute:
            raise ValueError("a traffic trace needs at least one minute")
        if any(not math.isfinite(r) or r < 0 for r in self.per_minute):
            raise ValueError("request rates must be finite and >= 0")

    @property
    def duration_s(self) -> float:
        return len(self.per_minute) * MINUTE

    @classmethod
    def from_file(cls, path: Path) -> RateTrace:
        """A JSON list of rates, or text with one rate per line (`rate` or `minute,rate`;
        lines starting with `#` and a header line are skipped)."""
        text = Path(path).read_text()
        if text.lstrip().startswith("["):
            return cls(tuple(float(v) for v in json.loads(text)))
        rates: list[float] = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            field = line.split(",")[-1].strip()
            try:
                rates.append(float(field))
            except ValueError:
                if rates:
                    raise ValueError(f"{path}: not a rate: {line!r}") from None
                continue  # a header
        return cls(tuple(rates))

    @classmethod
    def diurnal(cls, minutes: int, peak: float, trough: float, period_minutes: float = 1440.0,
                peak_at_minute: float = 720.0) -> RateTrace:  # fmt: skip
        """A cosine day: `trough` at the night's low, `peak` at `peak_at_minute`."""
        rates = []
        for m in range(minutes):
            phase = 2 * math.pi * (m + 0.5 - peak_at_minute) / period_minutes
            rates.append(trough + (peak - trough) * (1 + math.cos(phase)) / 2)
        return cls(tuple(rates))

    @classmethod
    def bursty(cls, minutes: int, base: float, burst: float, burst_minutes: int, bursts: int,
               seed: int) -> RateTrace:  # fmt: skip
        """`base` with `bursts` bursts of `burst` req/s, each `burst_minutes` long, at
        random non-overlapping starts (the first minute and the last quarter, at most ten
        minutes, stay at base: a scale-down after the last burst is part of the trace)."""
        rates = [base] * minutes
        rng = np.random.default_rng([seed, 5])
        tail = min(10, max(1, minutes // 4))
        free = list(range(1, max(1, minutes - burst_minutes - tail + 1)))
        placed = 0
        while placed < bursts and free:
            start = int(rng.choice(free))
            span = range(start, min(minutes, start + burst_minutes))
            for m in span:
                rates[m] = burst
            free = [s for s in free if s + burst_minutes + 2 < start or s > start + burst_minutes + 2]
            placed += 1
        return cls(tuple(rates))


def poisson_arrivals(trace: RateTrace, seed: int) -> list[float]:
    """Arrival times of a Poisson process whose rate is constant within each minute."""
    rng = np.random.default_rng([seed, 6])
    times: list[float] = []
    for m, rate in enumerate(trace.per_minute):
        if rate <= 0:
            continue
        t = m * MINUTE
        end = t + MINUTE
        while True:
            t += float(rng.exponential(1.0 / rate))
            if t >= end:
                break
            times.append(t)
    return times


@dataclass(frozen=True)
class RequestShape:
    input_len: int = 256
    input_min: int = 64
    output_len: int = 192
    output_min: int = 32
    shared_prefix_len: int = 0  # each prompt starts with one of `num_prefixes` prefixes
    num_prefixes: int = 1

    def problems(self) -> list[str]:
        out = []
        if not 1 <= self.input_min <= self.input_len:
            out.append("--input-min must be in [1, --input-len]")
        if not 1 <= self.output_min <= self.output_len:
            out.append("--output-min must be in [1, --output-len]")
        if self.shared_prefix_len < 0 or self.num_prefixes < 1:
            out.append("--shared-prefix-len must be >= 0 and --num-prefixes >= 1")
        return out


@dataclass(frozen=True)
class PlannedRequest:
    arrival: float
    input_ids: tuple[int, ...]
    max_new_tokens: int


def planned_requests(
    arrivals: list[float], shape: RequestShape, vocab_size: int, eos: set[int], seed: int
) -> list[PlannedRequest]:
    """Prompts of random token ids (never EOS) with lengths uniform in the shape's ranges."""
    rng = np.random.default_rng([seed, 7])
    n = len(arrivals)
    if n == 0:
        return []
    ins = sample_lengths(rng, shape.input_len, 0.0, n, shape.input_min)
    outs = sample_lengths(rng, shape.output_len, 0.0, n, shape.output_min)
    pool = np.array([i for i in range(3, vocab_size) if i not in eos], dtype=np.int64)
    prefixes = [tuple(int(t) for t in rng.choice(pool, size=shape.shared_prefix_len))
                for _ in range(shape.num_prefixes)] if shape.shared_prefix_len else []  # fmt: skip
    which = rng.integers(0, max(1, shape.num_prefixes), size=n)
    out = []
    for i, (t, n_in, n_out) in enumerate(zip(arrivals, ins, outs, strict=True)):
        prefix = prefixes[int(which[i])] if prefixes else ()
        own = tuple(int(x) for x in rng.choice(pool, size=n_in))
        out.append(PlannedRequest(t, prefix + own, n_out))
    return out
