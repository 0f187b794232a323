"""Start the runtime: scheduler and detokenizer processes, then the HTTP server.

The parent process runs the API server and the TokenizerManager. It watches its children
(one scheduler per tensor-parallel rank, the detokenizer) through `supervisor.py`: if one
dies, or the watchdog finds the engine hung, it answers every client with an error, logs
why (naming the rank) and exits non-zero (Kubernetes restarts the pod) instead of keeping a
server that accepts requests and never answers. SIGTERM drains: /health turns 503, no new
requests are admitted, running ones finish within `--drain-timeout`.

With `--nnodes` > 1, a node other than node 0 runs only its ranks' schedulers
(`serve_follower_node`); see `distributed.topology`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.constants import BUNDLED_MODELS
from sluice.runtime.detokenizer.process import run_detokenizer_process
from sluice.runtime.distributed.topology import RankSpec, node_ranks
from sluice.runtime.engine.gpu_defaults import resolve_for_model
from sluice.runtime.entrypoints.api_config import ApiConfig
from sluice.runtime.entrypoints.harmony import harmony_encoding
from sluice.runtime.entrypoints.http_server import build_app
from sluice.runtime.entrypoints.request_limits import RequestLimits
from sluice.runtime.entrypoints.tokenizer_manager import WARMUP_RID, TokenizerManager
from sluice.runtime.ipc.messages import SamplingParams, SchedulerReady
from sluice.runtime.ipc.sockets import PortArgs
from sluice.runtime.metrics import MetricsCollector
from sluice.runtime.model.loader import load_tokenizer, resolve_model_path
from sluice.runtime.model.registry import architecture_for, read_model_config
from sluice.runtime.model.sharding import tensor_parallel_problem
from sluice.runtime.process_exit import run_then_exit
from sluice.runtime.scheduler.process import run_scheduler_process
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.supervisor import Supervisor
from sluice.runtime.threads import limit_helper_process_threads

logger = logging.getLogger("sluice.server")

WATCH_INTERVAL_S = 0.5



def served_name(args: ServerArgs, model_path: Path) -> str:
    if args.served_model_name:
        return args.served_model_name
    if args.model in BUNDLED_MODELS:
        return BUNDLED_MODELS[args.model]
    return Path(args.model.rstrip("/")).name.removesuffix(".gguf")


class ChildProcesses:
    """The scheduler processes (one per tensor-parallel rank of this node) and, on node 0,
    the detokenizer, started and watched together. A thread notes each exit as it happens,
    so the first to die is named first."""

    def __init__(
        self, args: ServerArgs, model_path: Path, port_args: PortArgs | None, ranks: list[RankSpec]
    ) -> None:
        ctx = mp.get_context("spawn")
        self._ready_reader, ready_writer = ctx.Pipe(duplex=False)
        self.procs = [
            ctx.Process(
                target=run_then_exit,
                args=(
                    run_scheduler_process,
                    args,
                    str(model_path),
                    port_args,
                    ready_writer if r.is_leader else None,
                    r,
                ),
                name=r.process_name,
            )
            for r in ranks
        ]
        if port_args is not None:  # node 0
            self.procs.append(
                ctx.Process(
                    target=run_then_exit,
                    args=(run_detokenizer_process, str(model_path), port_args, args.log_level),
                    name="detokenizer",
                )
            )
        for p in self.procs:
            p.start()
        ready_writer.close()
        self.exited: list[mp.Process] = []  # in the order they exited
        threading.Thread(target=self._note_exits, name="child-watch", daemon=True).start()

    def _note_exits(self) -> None:
        waiting = {p.sentinel: p for p in self.procs}
        while waiting:
            for sentinel in mp.connection.wait(list(waiting)):
                self.exited.append(waiting.pop(sentinel))  # type: ignore[arg-type]

    def dead(self) -> mp.Process | None:
        """The first child that exited, if any."""
        return self.exited[0] if self.exited else None

    def describe_exits(self) -> str:
        """"the <name> process exited with code <c>" for each exited child, first exit first."""
        return "; then ".join(f"the {p.name} process exited with code {p.exitcode}" for p in self.exited)

    def wait_ready(self, timeout: float) -> SchedulerReady:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._ready_reader.poll(WATCH_INTERVAL_S):
                try:
                    msg = self._ready_reader.recv()
                except EOFError:
                    msg = None
                if isinstance(msg, SchedulerReady):
                    return msg
                raise ChildDied("scheduler failed to start (see its log above)")
            if self.dead() is not None:
                raise ChildDied(f"{self.describe_exits()} during start-up")
        raise ChildDied(f"scheduler not ready after {timeout:.0f}s")

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()

    def stop(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.terminate()
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()


class ChildDied(RuntimeError):
    pass


class DrainingServer(uvicorn.Server):
    """uvicorn server whose first SIGTERM/SIGINT drains in-flight requests before exiting."""

    def __init__(self, config: uvicorn.Config, tm: TokenizerManager, drain_timeout: float) -> None:
        super().__init__(config)
        self.tm = tm
        self.drain_timeout = drain_timeout
        self.loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self.tm.draining or self.loop is None:
            super().handle_exit(sig, frame)
            return
        self.tm.draining = True
        logger.info(
            "signal %d: draining %d in-flight requests (at most %.0fs)",
            sig, self.tm.num_inflight, self.drain_timeout,
        )
        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._drain()))

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout
        while self.tm.num_inflight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.tm.num_inflight:
            logger.warning("drain timed out with %d requests in flight", self.tm.num_inflight)
        self.should_exit = True


async def warm_up(tm: TokenizerManager) -> None:
    """One short generation through every process, before /health reports ready."""
    ids = tm.tokenizer.encode("Hello")
    params = SamplingParams(max_new_tokens=2, temperature=0.0, ignore_eos=True)
    async for _ in tm.generate(ids, params, rid=WARMUP_RID):
        pass


def startup_problem(args: ServerArgs, model_path: Path) -> str | None:
    """What makes this server unable to start (one line), checked before any child starts."""
    visible_gpus = 0
    if args.resolved_device.startswith("cuda"):
        import torch

        visible_gpus = torch.cuda.device_count()
    try:  # an architecture, or an option of one, that Sluice does not implement
        config = read_model_config(model_path)
        architecture_for(config)
    except ValueError as err:
        return str(err)
    if ApiConfig.of(args).harmony:
        try:
            harmony_encoding()
        except RuntimeError as err:
            return str(err)
    return tensor_parallel_problem(
        args.tensor_parallel_size, args.nnodes, config, args.resolved_device, visible_gpus
    )


def _ranks(args: ServerArgs) -> list[RankSpec]:
    ranks = node_ranks(args.tensor_parallel_size, args.nnodes, args.node_rank, args.dist_init_addr)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.resolved_device == "cpu" and len(ranks) > (cores or 1):
        logger.warning("%d tensor-parallel ranks on %s CPU cores", len(ranks), cores)
    return ranks


def serve_follower_node(args: ServerArgs, model_path: Path) -> int:
    """Node `--node-rank` > 0 of a multi-node group: its ranks only, until one exits."""
    children = ChildProcesses(args, model_path, None, _ranks(args))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while len(children.exited) < len(children.procs):
            if any(p.exitcode != 0 for p in children.exited):
                logger.error("%s; stopping this node", children.describe_exits())
                return 1
            time.sleep(WATCH_INTERVAL_S)
        return 0
    finally:
        children.stop()


def launch_server(args: ServerArgs) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    cache_dir = Path(args.model_cache_dir) if args.model_cache_dir else default_cache_dir()
    model_path = resolve_model_path(args.model, cache_dir)
    if (problem := startup_problem(args, model_path)) is not None:
        print(f"sluice serve: {problem}", file=sys.stderr)
        return 2
    args = resolve_for_model(args, model_path)  # GPU: auto sizes from its memory, once for all
    if args.node_rank > 0:
        return serve_follower_node(args, model_path)
    port_args = PortArgs.fresh()
    children = ChildProcesses(args, model_path, port_args, _ranks(args))
    try:
        tokenizer = load_tokenizer(model_path)  # while the children start (about 2 s)
        ready = children.wait_ready(args.startup_timeout)
    except ChildDied as err:
        logger.error("%s", err)
        children.stop()
        return 1
    except BaseException:
        children.stop()
        raise
    limit_helper_process_threads()  # after the children started: they are not to inherit it
    tm = TokenizerManager(
        tokenizer, served_name(args, model_path), ready, port_args, RequestLimits.from_args(args)
    )
    tm.processes = {p.name: p.pid for p in children.procs}
    metrics = MetricsCollector(
        tm.served_model_name, tm.stats, compat=args.metrics_compat, page_size=ready.page_size,
        lora=args.enable_lora,
    )
    app = build_app(tm, args, metrics_handler=metrics.handler)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    server = DrainingServer(config, tm, args.drain_timeout)
    supervisor = Supervisor(tm, children, server, args.watchdog_timeout)

    @app.on_event("startup")
    async def _start() -> None:
        server.loop = asyncio.get_running_loop()
        tm.start()
        asyncio.get_running_loop().create_task(supervisor.run())
        if not args.disable_warmup:
            await warm_up(tm)
        metrics.attach(tm)  # after the warm-up: it is not a request to count
        tm.is_ready = True
        logger.info(
            "serving %s on http://%s:%d (KV pool %d tokens, context %d, %d request slots)",
            tm.served_model_name, args.host, args.port, ready.max_total_tokens,
            ready.context_len, ready.max_running_requests,
        )

    try:
        server.run()
    finally:
        tm.close()
        children.stop()
    return supervisor.exit_code
