"""Start `sluice router`: the worker pool, health probing, discovery, the HTTP server."""

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
from sluice.runtime.router.discovery import EndpointSliceDiscovery, own_namespace
from sluice.runtime.router.health import HealthConfig, HealthMonitor
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import CacheAwareConfig, make_policy
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.responses import ResponseAffinity
from sluice.runtime.router.workers import BackoffPolicy, WorkerPool

logger = logging.getLogger("sluice.router")


@dataclass
class Router:
    """Everything one router process runs, built from its args (tests build it in-process)."""

    args: RouterArgs
    pool: WorkerPool
    app: Any  # the Starlette app

    @classmethod
    def build(cls, args: RouterArgs) -> Router:
        backoff = BackoffPolicy(args.retry_backoff_initial, args.retry_backoff_max)
        pool = WorkerPool(tree_size=args.max_tree_characters, backoff=backoff)
        for url in args.worker_urls:
            pool.add(url)
        policy = make_policy(
            args.policy,
            CacheAwareConfig(
                args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold
            ),
        )
        metrics = RouterMetrics(pool, policy.name)
        state: dict[str, Any] = {}

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> AsyncIterator[None]:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
            timeout = httpx.Timeout(None, connect=args.connect_timeout)
            async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
                router.forwarder.client = client
                health = HealthMonitor(
                    pool,
                    HealthConfig(
                        args.health_interval, args.health_timeout, args.health_failure_threshold
                    ),
                    client,
                )
                state["health"] = asyncio.get_running_loop().create_task(health.run())
                discovery = None
                if args.discovery_enabled:
                    discovery = EndpointSliceDiscovery(
                        namespace=args.discover_namespace or own_namespace(),
                        selector=args.discover_selector,
                        port_name=args.discover_port_name,
                        on_change=pool.sync_discovered,
                        loop=asyncio.get_running_loop(),
                        kubeconfig=args.kubeconfig,
                        backoff_initial=args.retry_backoff_initial,
                        backoff_max=args.retry_backoff_max,
                    )
                    discovery.start()
                logger.info(
                    "routing on http://%s:%d policy=%s workers=%s discovery=%s",
                    args.host, args.port, policy.name, list(args.worker_urls) or "none",
                    args.discover_selector or "off",
                )  # fmt: skip
                try:
                    yield
                finally:
                    if discovery is not None:
                        discovery.stop()
                    state["health"].cancel()

        # the client is made inside the server's loop; the forwarder gets it at start-up
        forwarder = Forwarder(pool, None, metrics, args.request_timeout)  # type: ignore[arg-type]
        affinity = ResponseAffinity(args.response_affinity_size, args.response_probe_timeout)
        router = RouterApp(pool, policy, forwarder, metrics, affinity)
        return cls(args, pool, build_router_app(router, lifespan=lifespan))


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
