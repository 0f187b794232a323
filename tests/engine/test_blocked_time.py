"""The overlap's proof on a GPU is the scheduler thread's blocked time per step: the
executors count it and log one grep-able line (scripts/gpu_check.sh reads blocked_pct)."""

from __future__ import annotations

import logging
import re

from sluice.runtime.engine.blocked_time import BlockedTime


def test_the_line_reports_per_step_wait_and_enqueue_and_the_waits_share_of_the_wall():
    b = BlockedTime("overlap", every=1000, since=10.0)
    for _ in range(4):
        b.waited(0.001)
        b.enqueued(0.002)
    line = b.line(now=10.1)  # 4 steps in 100 ms
    assert line == ("blocked_time loop=overlap steps=4 step_ms=25.00 wait_ms=1.00 "
                    "enqueue_ms=2.00 blocked_pct=4.0")  # fmt: skip


def test_a_line_is_logged_every_n_steps_and_the_counts_restart(caplog):
    b = BlockedTime("normal", every=3)
    with caplog.at_level(logging.INFO, logger="sluice.executor"):
        for _ in range(7):
            b.waited(0.0)
            b.enqueued(0.0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("blocked_time")]
    assert len(lines) == 2 and all(re.search(r"loop=normal steps=3 .* blocked_pct=", s) for s in lines)
    assert b.steps == 1
