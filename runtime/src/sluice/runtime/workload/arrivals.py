"""When the benchmark's requests are sent: Poisson arrivals, or all at once."""

from __future__ import annotations

import math

import numpy as np


def arrival_offsets(n: int, request_rate: float, seed: int) -> list[float]:
    """Send times in seconds after the start: 0 for all at rate inf, else Poisson arrivals
    (exponential gaps of mean 1/rate, the first request at 0)."""
    if request_rate <= 0:
        raise ValueError(f"request rate must be > 0, got {request_rate}")
    if math.isinf(request_rate) or n == 0:
        return [0.0] * n
    gaps = np.random.default_rng([seed, 1]).exponential(1.0 / request_rate, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
