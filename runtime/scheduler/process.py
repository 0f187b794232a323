"""The scheduler process: ZeroMQ in, scheduler ticks, ZeroMQ out."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection

import zmq

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.sockets import (
    PortArgs,
    pull_socket,
    push_socket,
    recv,
    recv_all_nowait,
    send,
)
from sluice.runtime.scheduler.policy import PolicyConfig
from sluice.runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.scheduler")

STATS_INTERVAL_S = 1.0


def build_scheduler(args: ServerArgs, worker: ModelWorker) -> Scheduler:
    config = SchedulerConfig(
        max_running_requests=args.max_running_requests,
        max_prefill_tokens=args.max_prefill_tokens,
        chunk_size=args.chunk_size,
        context_len=worker.context_len,
        policy=PolicyConfig(
            name=args.schedule_policy,
            in_batch_check_threshold=args.in_batch_prefix_check_threshold,
            in_batch_deprioritize_threshold=args.in_batch_prefix_deprioritize_threshold,
            seed=args.random_seed,
        ),
        retraction_policy=args.retraction_policy,
        init_new_token_ratio=min(1.0, args.init_new_token_ratio * args.schedule_conservativeness),
        random_seed=args.random_seed,
    )
    return Scheduler(
        config,
        worker.cache,
        worker.forward,
        worker.eos_token_ids,
        decode_text=worker.decode_text,
    )


def run_scheduler_process(args: ServerArgs, model_path: str, port_args: PortArgs, ready: Connection) -> None:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    parent = os.getppid()
    try:
        worker = ModelWorker(args, model_path)
        scheduler = build_scheduler(args, worker)
        ctx = zmq.Context()
        inbox = pull_socket(ctx, port_args.scheduler_input)
        outbox = push_socket(ctx, port_args.detokenizer_input)
        ready.send(worker.ready_message())
        ready.close()
        logger.info(
            "scheduler ready: KV pool %d tokens (%d pages of %d), %d request slots, context %d",
            worker.max_total_tokens, worker.cache.allocator.num_pages, args.page_size,
            args.max_running_requests, worker.context_len,
        )
        serve_forever(scheduler, inbox, outbox, parent)
    except Exception:
        logger.error("scheduler process crashed:\n%s", traceback.format_exc())
        try:
            ready.send(None)
        except Exception:
            pass
        sys.exit(1)


def serve_forever(scheduler: Scheduler, inbox: zmq.Socket, outbox: zmq.Socket, parent: int) -> None:
    last_stats = 0.0
    tokens_at_last_stats = 0
    while True:
        if scheduler.has_work:
            msgs = recv_all_nowait(inbox)
        else:
            first = recv(inbox, timeout_ms=int(STATS_INTERVAL_S * 1000))
            msgs = [] if first is None else [first, *recv_all_nowait(inbox)]
            if first is None and os.getppid() != parent:
                logger.error("the server process is gone; scheduler exiting")
                return
        for msg in msgs:
            scheduler.handle(msg)
        scheduler.step()
        out = scheduler.take_output()
        if out is not None:
            send(outbox, out)
        now = time.monotonic()
        if now - last_stats >= STATS_INTERVAL_S or msgs:
            stats = scheduler.stats()
            generated = scheduler.counters.generated_tokens
            if last_stats:
                stats.generation_throughput = (generated - tokens_at_last_stats) / (now - last_stats)
            if now - last_stats >= STATS_INTERVAL_S:
                last_stats, tokens_at_last_stats = now, generated
            send(outbox, stats)
