"""The scheduler's loop in its process: ZeroMQ in, scheduler ticks, ZeroMQ out, and the
stats it publishes (when, and the generation throughput they carry)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from sluice.runtime.ipc.messages import SchedulerStats, TokenizedGenerateReq
from sluice.runtime.ipc.sockets import recv, recv_all_nowait, send
from sluice.runtime.scheduler.ranks import Tick, TickBroadcaster
from sluice.runtime.scheduler.schedule_trace import ScheduleTrace, wall_to_monotonic
from sluice.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("sluice.scheduler")

STATS_INTERVAL_S = 1.0  # stats are published at least this often
THROUGHPUT_WINDOW_S = 5.0  # generation throughput is averaged over this sliding window
KV_USAGE_STEP = 0.05  # a KV usage change this large is published at once
PAUSED_POLL_S = 0.01  # how often a paused loop looks for its release


class LoopGate(Protocol):
    """Where the loop may be held from outside: a test's hold gate (`testing.hold_gate`);
    a server runs `OPEN`."""

    @property
    def paused(self) -> bool:
        """Take requests in and publish stats, but run no tick."""

    def after_tick(
        self, output_lens: Callable[[], list[int]], publish: Callable[[], dict[str, Any]]
    ) -> None:
        """Called after each tick's outputs and stats are sent; may block. `output_lens`:
        each live request's output length; `publish`: send the stats now, and return them."""


class _Open:
    paused = False

    def after_tick(
        self, output_lens: Callable[[], list[int]], publish: Callable[[], dict[str, Any]]
    ) -> None:
        pass


OPEN: LoopGate = _Open()


def serve_forever(
    scheduler: Scheduler,
    inbox: zmq.Socket,
    outbox: zmq.Socket,
    parent: int,
    overlap: bool = False,
    timing_interval_s: float = 0.0,
    gate: LoopGate = OPEN,
    followers: TickBroadcaster | None = None,
    trace: ScheduleTrace | None = None,
) -> None:
    publisher = StatsPublisher()

    def publish() -> dict[str, Any]:
        held = publisher.poll(scheduler, time.monotonic(), force=True)
        assert held is not None
        send(outbox, held)
        return dataclasses.asdict(held)

    def output_lens() -> list[int]:
        return [len(r.output_ids) for r in scheduler.live_requests()]

    step = scheduler.step_overlap if overlap else scheduler.step
    loop = "overlap" if overlap else "normal"
    last_timing = time.monotonic()
    while True:
        paused = gate.paused
        idle = not scheduler.has_work or paused
        if not idle:
            msgs = recv_all_nowait(inbox)
        else:
            scheduler.on_idle()  # reset new_token_ratio and check integrity before waiting
            wait_s = PAUSED_POLL_S if paused else STATS_INTERVAL_S
            first = recv(inbox, timeout_ms=int(wait_s * 1000))
            msgs = [] if first is None else [first, *recv_all_nowait(inbox)]
            if first is None and os.getppid() != parent:
                logger.error("the server process is gone; scheduler exiting")
                if followers is not None:
                    followers.publish(Tick(stop=True))
                return
        # read again: a test pauses before it sends, so what woke us up sees the pause
        run = not gate.paused
        if followers is not None:  # the other ranks handle the same messages in this tick
            followers.publish(Tick(idle, run, False, msgs))
        for msg in msgs:
            if trace is not None and isinstance(msg, TokenizedGenerateReq):
                trace.arrival(msg.rid, len(msg.input_ids), wall_to_monotonic(msg.arrival_time))
            scheduler.handle(msg)
        # what the messages produced (a P/D first token, a refusal) goes now, not after a tick
        if msgs and (out := scheduler.take_output()) is not None:
            send(outbox, out)
        if run:
            step()
        if timing_interval_s and time.monotonic() - last_timing >= timing_interval_s:
            last_timing = time.monotonic()
            logger.info("tick timing loop=%s %s", loop, scheduler.timing.take().summary())
        out = scheduler.take_output()
        if out is not None:
            send(outbox, out)
        for reply in scheduler.take_replies():
            send(outbox, reply)
        stats = publisher.poll(scheduler, time.monotonic())
        if stats is not None:
            send(outbox, stats)
        gate.after_tick(output_lens, publish)


@dataclass
class ThroughputWindow:
    """Tokens per second over the last `window_s` seconds, from a cumulative count.

    Keeps (time, count) samples; the oldest kept one is the newest at or before the
    window's start, so the rate spans the whole window (and falls to 0 once a full window
    passes without a token).
    """

    window_s: float = THROUGHPUT_WINDOW_S
    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def update(self, now: float, total: int) -> float:
        self.samples.append((now, total))
        while len(self.samples) > 2 and self.samples[1][0] <= now - self.window_s:
            self.samples.popleft()
        t0, n0 = self.samples[0]
        return (total - n0) / (now - t0) if now > t0 else 0.0


@dataclass
class StatsPublisher:
    """Decides when the scheduler publishes its `SchedulerStats`: at least every
    `STATS_INTERVAL_S`, and at once when something an autoscaler or a dashboard reads has
    changed: the queue length, the running count, retractions, KV usage by a step of
    `KV_USAGE_STEP`, or requests were admitted (their queue times travel with the stats)."""

    throughput: ThroughputWindow = field(default_factory=ThroughputWindow)
    last_at: float | None = None
    last_key: tuple[int, int, int, int] | None = None

    def poll(self, scheduler: Scheduler, now: float, force: bool = False) -> SchedulerStats | None:
        stats = scheduler.load_stats()  # every tick: queue_prompt_tokens only when published
        key = (
            stats.queue_requests,
            stats.running_requests,
            stats.retractions_total,
            round(stats.kv_token_usage / KV_USAGE_STEP),
        )
        queue_times = scheduler.take_queue_times()
        transfer_seconds = scheduler.take_transfer_seconds()
        due = self.last_at is None or now - self.last_at >= STATS_INTERVAL_S
        if not (force or due or queue_times or transfer_seconds or key != self.last_key):
            return None
        stats.queue_prompt_tokens = scheduler.queue_prompt_tokens()
        stats.queue_times = queue_times
        stats.disagg_transfer_seconds = transfer_seconds
        generated = scheduler.counters.generated_tokens
        stats.generation_throughput = self.throughput.update(now, generated)
        self.last_at, self.last_key = now, key
        return stats
