"""Start `sluice router`: the worker pool (P/D: a prefill and a decode pool), health probing,
discovery (P/D: one per side), the HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn

from sluice.runtime.router.app import RouterApp, build_router_app
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.discovery import EndpointSliceDiscovery, OnChange, own_namespace
from sluice.runtime.router.health import HealthConfig, HealthMonitor
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.pd import PDForwarder
from sluice.runtime.router.pd_app import PDRouterApp
from sluice.runtime.router.pd_discovery import PrefillDiscovery
from sluice.runtime.router.policies import CacheAwareConfig, make_policy
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.responses import ResponseAffinity
from sluice.runtime.router.workers import BackoffPolicy, WorkerPool

logger = logging.getLogger("sluice.router")


@dataclass
class Router:
    """Everything one router process runs, built from its args (tests build it in-process)."""

    args: RouterArgs
    pool: WorkerPool  # P/D: the decode servers
    app: Any  # the Starlette app
    prefill_pool: WorkerPool | None = None  # P/D only

    @classmethod
    def build(cls, args: RouterArgs) -> Router:
        backoff = BackoffPolicy(args.retry_backoff_initial, args.retry_backoff_max)
        pool = WorkerPool(tree_size=args.max_tree_characters, backoff=backoff)
        for url in args.decode if args.pd_disaggregation else args.worker_urls:
            pool.add(url)
        prefill_pool = None
        if args.pd_disaggregation:
            prefill_pool = WorkerPool(tree_size=args.max_tree_characters, backoff=backoff)
            for server in args.prefill_servers:
                prefill_pool.add(server.url)
        policy = make_policy(
            args.policy,
            CacheAwareConfig(
                args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold
            ),
        )
        other_pools = [] if prefill_pool is None else [prefill_pool]
        metrics = RouterMetrics(pool, policy.name, other_pools)

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            timeout = httpx.Timeout(None, connect=args.connect_timeout)
            async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
                forwarder.client = client
                config = HealthConfig(
                    args.health_interval, args.health_timeout, args.health_failure_threshold
                )
                loop = asyncio.get_running_loop()
                probing = [
                    loop.create_task(HealthMonitor(p, config, client).run())
                    for p in (pool, *other_pools)
                ]
                discoveries = [_discovery(args, s, feed, loop) for s, feed in feeds if s]
                for discovery in discoveries:
                    discovery.start()
                _log_start(args, policy.name)
                try:
                    yield
                finally:
                    for discovery in discoveries:
                        discovery.stop()
                    for task in probing:
                        task.cancel()

        # the client is made inside the server's loop; the forwarder gets it at start-up
        forwarder = Forwarder(pool, None, metrics, args.request_timeout)  # type: ignore[arg-type]
        # each discovery's label selector ("": none) and what it tells of the endpoints
        feeds: list[tuple[str, OnChange]]
        if prefill_pool is not None:
            bootstrap = {s.url: s.bootstrap for s in args.prefill_servers}
            pd = PDForwarder(prefill_pool, pool, bootstrap, forwarder, policy, metrics)
            router: RouterApp = PDRouterApp(pd, forwarder, metrics)
            feeds = [
                (args.discover_prefill_selector, PrefillDiscovery(prefill_pool, pd.bootstrap)),
                (args.discover_decode_selector, pool.sync_discovered),
            ]
        else:
            affinity = ResponseAffinity(args.response_affinity_size, args.response_probe_timeout)
            router = RouterApp(pool, policy, forwarder, metrics, affinity)
            feeds = [(args.discover_selector, pool.sync_discovered)]
        return cls(args, pool, build_router_app(router, lifespan=lifespan), prefill_pool)


def _discovery(
    args: RouterArgs, selector: str, on_change: OnChange, loop: asyncio.AbstractEventLoop
) -> EndpointSliceDiscovery:
    return EndpointSliceDiscovery(
        namespace=args.discover_namespace or own_namespace(),
        selector=selector,
        port_name=args.discover_port_name,
        on_change=on_change,
        loop=loop,
        kubeconfig=args.kubeconfig,
        backoff_initial=args.retry_backoff_initial,
        backoff_max=args.retry_backoff_max,
    )


def _log_start(args: RouterArgs, policy: str) -> None:
    where = f"http://{args.host}:{args.port}"
    if args.pd_disaggregation:
        prefill = [f"{s.url} (bootstrap {s.bootstrap})" for s in args.prefill_servers]
        logger.info(
            "routing P/D on %s policy=%s prefill=%s decode=%s discovery prefill=%s decode=%s",
            where, policy, prefill, list(args.decode),
            args.discover_prefill_selector or "off", args.discover_decode_selector or "off",
        )  # fmt: skip
        return
    logger.info(
        "routing on %s policy=%s workers=%s discovery=%s",
        where, policy, list(args.worker_urls) or "none", args.discover_selector or "off",
    )  # fmt: skip


def run_router(args: RouterArgs) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
    router = Router.build(args)
    config = uvicorn.Config(
        router.app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=False,
        timeout_graceful_shutdown=int(args.drain_timeout),
    )
    uvicorn.Server(config).run()
    return 0
