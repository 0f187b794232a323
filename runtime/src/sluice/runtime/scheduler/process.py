"""The scheduler process: ZeroMQ in, scheduler ticks, ZeroMQ out.

With tensor parallelism there is one per rank: rank 0 does all of the above and broadcasts
each tick to the other ranks, which replay it (`scheduler.ranks`) and talk to no one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import zmq

from sluice.runtime.constrained import GrammarCompiler
from sluice.runtime.distributed.group import SINGLE_RANK, init_process_group
from sluice.runtime.distributed.topology import RankSpec
from sluice.runtime.engine.executor import SyncExecutor, overlap_executor
from sluice.runtime.engine.fault_injection import FaultPlan
from sluice.runtime.engine.model_worker import ModelWorker, PoolLayout
from sluice.runtime.ipc.messages import SchedulerStats
from sluice.runtime.ipc.sockets import (
    PortArgs,
    pull_socket,
    push_socket,
    recv,
    recv_all_nowait,
    send,
)
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.faults import answer_everyone
from sluice.runtime.scheduler.hold_gate import HoldGate
from sluice.runtime.scheduler.lora import AdapterGate
from sluice.runtime.scheduler.policy import PolicyConfig
from sluice.runtime.scheduler.ranks import Tick, TickBroadcaster, follow_leader, grammar_queue
from sluice.runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.scheduler")

STATS_INTERVAL_S = 1.0  # stats are published at least this often
THROUGHPUT_WINDOW_S = 5.0  # generation throughput is averaged over this sliding window
KV_USAGE_STEP = 0.05  # a KV usage change this large is published at once
PAUSED_POLL_S = 0.01  # how often a paused scheduler (test hold gate) looks for its release


def build_scheduler(args: ServerArgs, worker: ModelWorker) -> Scheduler:
    """The scheduler for `args` over `worker`: its bookkeeping (pages, rows, prefix cache)
    is built here, sized to the worker's device pool (and its args: auto sizes resolved)."""
    args = worker.args
    executor = overlap_executor(worker) if args.overlap_schedule else SyncExecutor(worker)
    grammars = grammar_queue(
        GrammarCompiler(worker.tokenizer, worker.model_config.vocab_size, worker.eos_token_ids),
        worker.tp,
    )
    return Scheduler(
        scheduler_config(args, worker.context_len, worker.model_config.vocab_size),
        kv_cache(args, worker.pool),
        executor,
        worker.eos_token_ids,
        decode_text=worker.decode_text,
        grammars=grammars,
        adapters=AdapterGate(worker.lora),
    )


def kv_cache(args: ServerArgs, pool: PoolLayout) -> KVCacheManager:
    """The host bookkeeping of a worker's pool: pages, request rows, the prefix cache."""
    return KVCacheManager.create(
        TokenToKVPoolAllocator(pool.total_tokens, pool.page_size),
        RequestSlots(pool.rows, pool.context_len + pool.page_size),
        enable_radix=not args.disable_radix_cache,
    )


def scheduler_config(args: ServerArgs, context_len: int, vocab_size: int = 0) -> SchedulerConfig:
    """The scheduler's decisions as the flags set them (`sluice simulate` uses this too);
    `vocab_size` 0: token ids are not checked against the model's vocabulary."""
    return SchedulerConfig(
        max_running_requests=args.max_running_requests,
        max_prefill_tokens=args.max_prefill_tokens,
        chunk_size=args.chunk_size,
        context_len=context_len,
        policy=PolicyConfig(
            name=args.schedule_policy,
            in_batch_check_threshold=args.in_batch_prefix_check_threshold,
            in_batch_deprioritize_threshold=args.in_batch_prefix_deprioritize_threshold,
            seed=max(args.random_seed, 0),
        ),
        retraction_policy=args.retraction_policy,
        init_new_token_ratio=min(1.0, args.init_new_token_ratio * args.schedule_conservativeness),
        random_seed=args.random_seed,
        mixed_chunk=not args.disable_mixed_chunk,
        max_prefill_streak=args.max_prefill_streak,
        vocab_size=vocab_size,
        max_loras=args.max_loras if args.enable_lora else 0,
    )


def run_scheduler_process(
    args: ServerArgs,
    model_path: str,
    port_args: PortArgs,
    ready: Connection | None,
    rank: RankSpec | None = None,
) -> None:
    """One scheduler + model worker; `rank` places it in a tensor-parallel group (only rank
    0 gets the `ready` pipe and the sockets)."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    parent = os.getppid()
    name = rank.process_name if rank is not None else "scheduler"
    try:
        tp = SINGLE_RANK
        if rank is not None and rank.size > 1:
            logger.info("%s: pid %d", name, os.getpid())
            tp = init_process_group(
                rank, args.resolved_device, ordered_sum=args.enable_deterministic_inference
            )
        worker = ModelWorker(args, model_path, tp)
        worker.faults = FaultPlan.from_env()  # tests only
        scheduler = build_scheduler(args, worker)
        overlap, why = args.overlap_choice
        logger.info("%s loop (%s)", "overlap" if overlap else "normal", why)
        if not tp.is_leader:
            follow_leader(scheduler, tp, overlap)
            return
        ctx = zmq.Context()
        inbox = pull_socket(ctx, port_args.scheduler_input)
        outbox = push_socket(ctx, port_args.detokenizer_input)
        assert ready is not None
        ready.send(worker.ready_message())
        ready.close()
        logger.info(
            "scheduler ready: KV pool %d tokens (%d pages of %d), %d request slots, context %d%s",
            worker.pool.total_tokens,
            scheduler.cache.allocator.num_pages,
            args.page_size,
            args.max_running_requests,
            worker.context_len,
            f", tensor parallel over {tp.size} ranks" if tp.size > 1 else "",
        )
        try:
            serve_forever(
                scheduler,
                inbox,
                outbox,
                parent,
                overlap,
                args.log_tick_timing,
                HoldGate.from_env(),
                TickBroadcaster(tp) if tp.size > 1 else None,
            )
        except Exception as exc:  # the engine is down: answer every request, then exit 1
            answer_everyone(scheduler, outbox, exc)
            raise
    except Exception:
        logger.error("%s process crashed:\n%s", name, traceback.format_exc())
        try:
            if ready is not None:
                ready.send(None)
        except Exception:
            pass
        sys.exit(1)


def serve_forever(
    scheduler: Scheduler,
    inbox: zmq.Socket,
    outbox: zmq.Socket,
    parent: int,
    overlap: bool = False,
    timing_interval_s: float = 0.0,
    hold_gate: HoldGate | None = None,
    followers: TickBroadcaster | None = None,
) -> None:
    publisher = StatsPublisher()
    step = scheduler.step_overlap if overlap else scheduler.step
    loop = "overlap" if overlap else "normal"
    last_timing = time.monotonic()
    while True:
        paused = hold_gate is not None and hold_gate.paused
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
        run = not (hold_gate is not None and hold_gate.paused)
        if followers is not None:  # before handling: handling edits the messages
            followers.publish(Tick(idle, run, False, msgs))
        for msg in msgs:
            scheduler.handle(msg)
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
        if hold_gate is not None:

            def publish() -> dict[str, Any]:
                held = publisher.poll(scheduler, time.monotonic(), force=True)
                assert held is not None
                send(outbox, held)
                return dataclasses.asdict(held)

            hold_gate.hold_if_reached([len(r.output_ids) for r in scheduler.live_requests()], publish)


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
        stats = scheduler.stats()
        key = (
            stats.queue_requests,
            stats.running_requests,
            stats.retractions_total,
            round(stats.kv_token_usage / KV_USAGE_STEP),
        )
        queue_times = scheduler.take_queue_times()
        due = self.last_at is None or now - self.last_at >= STATS_INTERVAL_S
        if not (force or due or queue_times or key != self.last_key):
            return None
        stats.queue_times = queue_times
        generated = scheduler.counters.generated_tokens
        stats.generation_throughput = self.throughput.update(now, generated)
        self.last_at, self.last_key = now, key
        return stats
