"""What rank 0 tells the other ranks each tick, so their schedulers do what rank 0's does.

A scheduler's decisions depend only on its state and the messages it handles, in order,
plus three things only rank 0 knows: whether the tick began idle (`on_idle` resets the
new-token ratio), whether it runs a step (the test hold gate can pause rank 0), and when
to stop. Rank 0 broadcasts all of it as one `Tick` before handling the messages (handling
edits them in place); the other ranks replay it (`follower.follow_leader`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.distributed.group import TensorParallelGroup
from sluice.runtime.ipc import codec
from sluice.runtime.ipc.messages import TokenizedGenerateReq


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
