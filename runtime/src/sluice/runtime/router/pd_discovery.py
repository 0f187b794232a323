"""P/D servers found on Kubernetes (`--discover-prefill-selector`, `--discover-decode-selector`).

Each side runs behind its own Service, so each has its own EndpointSlices and its own
`EndpointSliceDiscovery`. A decode endpoint is a worker like any other
(`WorkerPool.sync_discovered`). A prefill endpoint also has a bootstrap address, where the
decode servers fetch its KV from: the endpoint's address and its slice's port named
`bootstrap` (the prefill pods' container port of that name), else
`DISAGG_DEFAULT_BOOTSTRAP_PORT` with one warning. `PrefillDiscovery` keeps the
`PDForwarder`'s bootstrap map covering exactly the prefill pool: an entry joins and leaves
with its worker (a static `--prefill` server keeps the port its flag gave).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sluice.runtime.constants import DISAGG_BOOTSTRAP_PORT_NAME, DISAGG_DEFAULT_BOOTSTRAP_PORT
from sluice.runtime.router.args import PrefillServer
from sluice.runtime.router.discovery import Endpoint
from sluice.runtime.router.workers import DISCOVERED, WorkerPool

logger = logging.getLogger("sluice.router.discovery")


class PrefillDiscovery:
    """The prefill side's discovery callback: syncs the pool and the bootstrap map."""

    def __init__(self, pool: WorkerPool, bootstrap: dict[str, str]) -> None:
        """`bootstrap`: the `PDForwarder`'s map (prefill URL -> `host:port`), written here."""
        self.pool = pool
        self.bootstrap = bootstrap
        self._warned_default_port = False

    def __call__(self, endpoints: Mapping[str, Endpoint]) -> None:
        self.pool.sync_discovered(endpoints)
        for url, endpoint in endpoints.items():
            if self.pool.workers[url].source == DISCOVERED:
                self.bootstrap[url] = self.bootstrap_of(endpoint)
        for url in set(self.bootstrap) - set(self.pool.workers):
            del self.bootstrap[url]

    def bootstrap_of(self, endpoint: Endpoint) -> str:
        port = endpoint.ports.get(DISAGG_BOOTSTRAP_PORT_NAME)
        if port is None:
            port = DISAGG_DEFAULT_BOOTSTRAP_PORT
            if not self._warned_default_port:
                self._warned_default_port = True
                logger.warning(
                    "prefill EndpointSlice has no port named %r (url=%s); using bootstrap "
                    "port %d for such endpoints",
                    DISAGG_BOOTSTRAP_PORT_NAME, endpoint.url, port,
                )  # fmt: skip
        return PrefillServer(endpoint.url, port).bootstrap
