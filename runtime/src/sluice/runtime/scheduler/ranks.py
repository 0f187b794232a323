"""Tensor-parallel rank replay: rank 0 decides, the other ranks' schedulers do what it did.

A scheduler's decisions depend only on its state and the messages it handles, in order,
plus three things only rank 0 knows: whether the tick began idle (`on_idle` resets the
new-token ratio), whether it runs a step (the test hold gate can pause rank 0), and when
to stop. Rank 0 broadcasts all of it as one `Tick` before handling the messages (handling
edits them in place); the other ranks replay it (`follow_leader`): they receive nothing from
the TokenizerManager, send nothing to the detokenizer, and their forwards run the same
batches as rank 0's (their collectives meet rank 0's).

Grammar readiness is rank 0's too (`SyncedGrammarQueue`): each rank compiles every grammar
itself, but when a compilation finishes differs by rank, so rank 0 says which requests are
ready and the others wait for exactly those. `ready()` runs at the same point of every
rank's identical schedule, on the scheduler thread, so its broadcast is on the control group.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.constrained import GrammarCompiler
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.ipc import codec
from sluice.runtime.ipc.messages import FinishReason, TokenizedGenerateReq
from sluice.runtime.scheduler.grammar import GrammarQueue
from sluice.runtime.scheduler.request import Req
from sluice.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("sluice.scheduler")


@dataclass(frozen=True)
class Tick:
    idle: bool = False  # the tick began with `scheduler.on_idle()`
    run: bool = True  # the tick runs a scheduler step
    stop: bool = False  # rank 0 is exiting: so do the others
    msgs: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class TickBroadcaster:
    """Rank 0's side."""

    tp: TensorParallelGroup

    def publish(self, tick: Tick) -> None:
        for msg in tick.msgs:
            if isinstance(msg, TokenizedGenerateReq) and not msg.arrival_time:
                msg.arrival_time = time.time()  # a scheduler stamps it otherwise: per rank
        self.tp.broadcast_bytes(codec.encode([tick.idle, tick.run, tick.stop, tick.msgs]))


def receive_tick(tp: TensorParallelGroup) -> Tick:
    """The other ranks' side: the next tick rank 0 published."""
    idle, run, stop, msgs = codec.decode(tp.broadcast_bytes(None))
    return Tick(idle, run, stop, msgs)


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


@dataclass
class SyncedGrammarQueue(GrammarQueue):
    tp: TensorParallelGroup = field(default=SINGLE_RANK)

    def ready(self) -> tuple[list[Req], list[tuple[Req, FinishReason]]]:
        mine = [req.rid for req, future in self.pending.values() if future.done()]
        rids = codec.decode(self.tp.broadcast_bytes(codec.encode(mine) if self.tp.is_leader else None))
        return self.take(set(rids))


def grammar_queue(compiler: GrammarCompiler, tp: TensorParallelGroup) -> GrammarQueue:
    return SyncedGrammarQueue(compiler, tp=tp) if tp.size > 1 else GrammarQueue(compiler)
