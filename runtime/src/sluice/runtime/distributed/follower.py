"""The scheduler loop of a tensor-parallel rank other than 0.

It receives nothing from the TokenizerManager and sends nothing to the detokenizer: it
replays rank 0's ticks on its own `Scheduler`, whose forwards run the same batches as rank
0's (their collectives meet rank 0's), and drops the outputs and stats rank 0 reports.
"""

from __future__ import annotations

import logging

from sluice.runtime.distributed.group import TensorParallelGroup
from sluice.runtime.distributed.ticks import receive_tick
from sluice.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("sluice.scheduler")


def follow_leader(scheduler: Scheduler, tp: TensorParallelGroup, overlap: bool) -> None:
    """Run rank 0's ticks until it stops (a dead rank 0 ends it with the collective's error)."""
    step = scheduler.step_overlap if overlap else scheduler.step
    while True:
        tick = receive_tick(tp)
        if tick.stop:
            logger.info("tp rank %d: rank 0 stopped; exiting", tp.rank)
            return
        if tick.idle:
            scheduler.on_idle()
        for msg in tick.msgs:
            scheduler.handle(msg)
        if tick.run:
            step()
        scheduler.take_output()  # rank 0 sends them
        scheduler.take_replies()
        scheduler.take_queue_times()
