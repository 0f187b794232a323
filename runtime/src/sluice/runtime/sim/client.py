"""The benchmark's client, replayed against a simulated replica: requests are sent at their
arrival offsets, at most `max_concurrency` at once (the next waiting request is sent when
one finishes, in arrival order, as `bench_serving`'s semaphore does), and each request's
clock starts when it is sent."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.runtime.sim.pd import SimPDPair
from sluice.runtime.sim.replica import SimReplica, SimRequest


@dataclass(frozen=True)
class ClientRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    offset: float  # seconds after the benchmark's start
    ignore_eos: bool = True


def replay(
    replica: SimReplica | SimPDPair,
    requests: Sequence[ClientRequest],
    start: float,
    max_concurrency: int = 0,
) -> dict[str, float]:
    """Send every request (offsets from `start` on the replica's clock) and run until all
    finished; returns each request's send time."""
    order = sorted(requests, key=lambda r: r.offset)
    sent: dict[str, float] = {}
    if max_concurrency <= 0:
        for r in order:
            sent[r.rid] = start + r.offset
            replica.submit(SimRequest(r.rid, r.input_ids, r.max_new_tokens, sent[r.rid], r.ignore_eos))
        replica.run_to_completion()
        return sent
    pending = deque(order)
    free_slots = [start] * max_concurrency  # when each slot became free (a min-heap)
    while pending or not replica.idle:
        send_at = max(start + pending[0].offset, free_slots[0]) if pending and free_slots else math.inf
        if send_at <= replica.clock.now or (replica.idle and send_at < math.inf):
            r = pending.popleft()
            heapq.heappop(free_slots)
            sent[r.rid] = send_at
            replica.clock.advance_to(send_at)
            replica.submit(SimRequest(r.rid, r.input_ids, r.max_new_tokens, send_at, r.ignore_eos))
            continue
        replica.advance(send_at)
        for trace in replica.take_finished():
            assert trace.finished_at is not None
            heapq.heappush(free_slots, trace.finished_at)
    return sent
