"""The scheduler process's composition root: the model worker, the scheduler over it, and
its loop (`scheduler.loop`), with the test hooks (`testing/`) where a test asks for them.

With tensor parallelism there is one per rank: rank 0 runs the loop and broadcasts each
tick to the other ranks, which replay it (`scheduler.ranks`) and talk to no one.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection

import zmq

from sluice.runtime.constrained import GrammarCompiler
from sluice.runtime.disagg import KVTransfer, open_transfer
from sluice.runtime.disagg.kv_pages import KVPages
from sluice.runtime.distributed.group import SINGLE_RANK, init_process_group
from sluice.runtime.distributed.topology import RankSpec
from sluice.runtime.engine.executor import Executor, SyncExecutor, overlap_executor
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.engine.worker_setup import PoolLayout
from sluice.runtime.ipc.sockets import (
    PortArgs,
    pull_socket,
    push_socket,
)
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.request_slots import RequestSlots
from sluice.runtime.memory.window_pages import WindowPages
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.faults import answer_everyone
from sluice.runtime.scheduler.loop import OPEN, serve_forever
from sluice.runtime.scheduler.lora import AdapterGate
from sluice.runtime.scheduler.policy import PolicyConfig
from sluice.runtime.scheduler.ranks import TickBroadcaster, follow_leader, grammar_queue
from sluice.runtime.scheduler.schedule_trace import ScheduleTrace, TracingExecutor
from sluice.runtime.scheduler.scheduler import Scheduler, SchedulerConfig
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.testing.fault_injection import FaultInjectingExecutor, FaultPlan
from sluice.runtime.testing.hold_gate import HoldGate

logger = logging.getLogger("sluice.scheduler")


def build_scheduler(
    args: ServerArgs,
    worker: ModelWorker,
    wrap: Callable[[Executor], Executor] | None = None,
    transfer: KVTransfer | None = None,
) -> Scheduler:
    """The scheduler for `args` over `worker`: its bookkeeping (pages, rows, prefix cache)
    is built here, sized to the worker's device pool (and its args: auto sizes resolved).
    `wrap`: what the executor runs inside (a test's fault injection); `transfer`: a P/D
    server's KV transfer."""
    args = worker.args
    executor: Executor = overlap_executor(worker) if args.overlap_schedule else SyncExecutor(worker)
    if wrap is not None:
        executor = wrap(executor)
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
        disagg_mode=args.disaggregation_mode,
        transfer=transfer,
    )


def kv_transfer(args: ServerArgs, worker: ModelWorker, inbox: str) -> KVTransfer | None:
    """A P/D server's end of the KV transfer (None otherwise); its events come to `inbox`."""
    if not args.disaggregated:
        return None
    if worker.window is not None:
        raise ValueError(
            f"--disaggregation-mode {args.disaggregation_mode}: models with sliding-window "
            "layers of their own KV pool (Gemma 2/3, gpt-oss) are not built for P/D yet"
        )
    transfer = open_transfer(
        args.disaggregation_transfer_backend, args.disaggregation_mode,
        KVPages(worker.kv, args.page_size), inbox, args.disaggregation_transfer_timeout,
        args.disaggregation_bootstrap_port if args.disaggregation_mode == "prefill" else 0,
    )  # fmt: skip
    if args.disaggregation_mode == "prefill":
        logger.info("P/D prefill: bootstrap port %d (%s)", transfer.bootstrap_port,
                    args.disaggregation_transfer_backend)  # fmt: skip
    return transfer


def kv_cache(args: ServerArgs, pool: PoolLayout) -> KVCacheManager:
    """The host bookkeeping of a worker's pool: pages, request rows, the prefix cache."""
    window = None
    if pool.window_tokens:
        full_pages = pool.total_tokens // pool.page_size
        window = WindowPages(full_pages, pool.window_tokens, pool.page_size, pool.window,
                             pool.window_holds_all)  # fmt: skip
    return KVCacheManager.create(
        TokenToKVPoolAllocator(pool.total_tokens, pool.page_size),
        RequestSlots(pool.rows, pool.context_len + pool.page_size),
        enable_radix=not args.disable_radix_cache,
        window=window,
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
        faults = FaultPlan.from_env()  # tests only, as is the hold gate
        trace = ScheduleTrace(args.schedule_trace) if args.schedule_trace and tp.is_leader else None

        def wrap(executor: Executor) -> Executor:
            if faults is not None:
                executor = FaultInjectingExecutor(executor, faults, tp.size)
            return executor if trace is None else TracingExecutor(executor, trace)

        transfer = kv_transfer(args, worker, port_args.scheduler_input) if tp.is_leader else None
        scheduler = build_scheduler(args, worker, wrap, transfer)
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
                HoldGate.from_env() or OPEN,
                TickBroadcaster(tp) if tp.size > 1 else None,
                trace,
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


