"""How long the scheduler thread is blocked by the device, per step: the overlap loop's
proof. An executor counts the time its `result()` waits for a forward and the time its
`submit()` takes to enqueue one (a hidden host sync in the launch shows up there), over the
wall time between log lines, and logs one grep-able line every `every` steps:

    blocked_time loop=overlap steps=256 step_ms=24.10 wait_ms=0.31 enqueue_ms=1.20 blocked_pct=1.3

`blocked_pct` is the wait's share of the wall time (scripts/gpu_check.sh reads it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger("sluice.executor")

LOG_EVERY_STEPS = 256


@dataclass
class BlockedTime:
    loop: str
    every: int = LOG_EVERY_STEPS
    steps: int = 0
    wait_s: float = 0.0
    enqueue_s: float = 0.0
    since: float = field(default_factory=time.perf_counter)

    def waited(self, seconds: float) -> None:
        self.wait_s += seconds

    def enqueued(self, seconds: float) -> None:
        self.enqueue_s += seconds
        self.steps += 1
        if self.steps >= self.every:
            self.flush()

    def line(self, now: float) -> str:
        wall = max(now - self.since, 1e-9)
        n = max(self.steps, 1)
        return (
            f"blocked_time loop={self.loop} steps={self.steps} step_ms={1000 * wall / n:.2f} "
            f"wait_ms={1000 * self.wait_s / n:.2f} enqueue_ms={1000 * self.enqueue_s / n:.2f} "
            f"blocked_pct={100 * self.wait_s / wall:.1f}"
        )

    def flush(self) -> None:
        now = time.perf_counter()
        if self.steps:
            logger.info("%s", self.line(now))
        self.steps, self.wait_s, self.enqueue_s, self.since = 0, 0.0, 0.0, now
