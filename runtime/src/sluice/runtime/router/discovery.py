"""Finding the runtime pods on Kubernetes from their EndpointSlices.

The selector is matched against EndpointSlice labels: `kubernetes.io/service-name=<svc>`
picks the slices of one Service (the EndpointSlice controller also copies the Service's own
labels onto them). Every endpoint whose `conditions.ready` is true (or unset, which the API
says to read as ready) on the port named `--discover-port-name` (or the slice's only port)
is a worker `http://<address>:<port>`; a terminating pod's endpoint turns not-ready and
leaves, so a draining pod gets no new requests.

The official `kubernetes` client is synchronous: list, then watch from the list's
resourceVersion, in a daemon thread; every change hands the event loop the full map of
worker URL -> `Endpoint` (the URL and its slice's named ports). A consumer that needs only
the URLs iterates it (`WorkerPool.sync_discovered`); P/D's prefill side also reads each
endpoint's `bootstrap` port (`pd_discovery.py`), one discovery per side. A watch that ends
is resumed from the last resourceVersion; a 410 Gone or any error relists (after a backoff
for errors).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("sluice.router.discovery")

WATCH_TIMEOUT_S = 300  # the server ends a watch after this; it is resumed at once
READ_TIMEOUT_S = WATCH_TIMEOUT_S + 30


@dataclass(frozen=True)
class Endpoint:
    """A ready endpoint: its worker URL and the named ports of its slice (a prefill pod's
    `bootstrap` port is one)."""

    url: str
    ports: Mapping[str, int]


OnChange = Callable[[dict[str, Endpoint]], None]  # told every worker URL -> its endpoint


def slice_endpoints(slice_obj: Any, port_name: str) -> dict[str, Endpoint]:
    """The ready endpoints of one EndpointSlice (a `V1EndpointSlice`), by worker URL."""
    ports = slice_obj.ports or []
    port = next((p.port for p in ports if p.name == port_name), None)
    if port is None and len(ports) == 1:
        port = ports[0].port
    if port is None:
        return {}
    named = {p.name: p.port for p in ports if p.name}
    ipv6 = (slice_obj.address_type or "") == "IPv6"
    endpoints = {}
    for ep in slice_obj.endpoints or []:
        ready = ep.conditions.ready if ep.conditions is not None else None
        if ready is False or not ep.addresses:
            continue
        host = f"[{ep.addresses[0]}]" if ipv6 else ep.addresses[0]
        url = f"http://{host}:{port}"
        endpoints[url] = Endpoint(url, named)
    return endpoints


def endpoint_urls(slice_obj: Any, port_name: str) -> set[str]:
    """Worker URLs of one EndpointSlice (a `V1EndpointSlice`)."""
    return set(slice_endpoints(slice_obj, port_name))


class EndpointSliceDiscovery:
    def __init__(
        self,
        namespace: str,
        selector: str,
        port_name: str,
        on_change: OnChange,
        loop: asyncio.AbstractEventLoop,
        kubeconfig: str = "",
        backoff_initial: float = 0.5,
        backoff_max: float = 15.0,
    ) -> None:
        self.namespace = namespace
        self.selector = selector
        self.port_name = port_name
        self.on_change = on_change
        self.loop = loop
        self.kubeconfig = kubeconfig
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._slices: dict[str, dict[str, Endpoint]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)
        self._api: Any = None

    def start(self) -> None:
        from kubernetes import client, config

        if self.kubeconfig:
            api_client = config.new_client_from_config(config_file=self.kubeconfig)
        else:
            try:
                config.load_incluster_config()
                api_client = client.ApiClient()
            except config.ConfigException:
                api_client = config.new_client_from_config()
        self._api = client.DiscoveryV1Api(api_client)
        logger.info("watching EndpointSlices namespace=%s selector=%s port=%s",
                    self.namespace, self.selector, self.port_name)  # fmt: skip
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _publish(self) -> None:
        endpoints = {url: ep for each in self._slices.values() for url, ep in each.items()}
        self.loop.call_soon_threadsafe(self.on_change, endpoints)

    def _list(self) -> str:
        result = self._api.list_namespaced_endpoint_slice(
            self.namespace, label_selector=self.selector, _request_timeout=30
        )
        self._slices = {s.metadata.name: slice_endpoints(s, self.port_name) for s in result.items}
        self._publish()
        return result.metadata.resource_version or ""

    def _apply(self, kind: str, obj: Any) -> None:
        name = obj.metadata.name
        if kind == "DELETED":
            self._slices.pop(name, None)
        else:  # ADDED, MODIFIED
            self._slices[name] = slice_endpoints(obj, self.port_name)
        self._publish()

    def _watch(self, resource_version: str) -> str:
        from kubernetes import watch

        w = watch.Watch()
        for event in w.stream(
            self._api.list_namespaced_endpoint_slice,
            self.namespace,
            label_selector=self.selector,
            resource_version=resource_version,
            timeout_seconds=WATCH_TIMEOUT_S,
            _request_timeout=READ_TIMEOUT_S,
        ):
            if self._stop.is_set():
                w.stop()
                break
            kind, obj = event["type"], event["object"]
            if kind == "BOOKMARK":
                continue
            self._apply(kind, obj)
            resource_version = obj.metadata.resource_version or resource_version
        return resource_version

    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException

        backoff = 0.0
        while not self._stop.is_set():
            try:
                rv = self._list()
                backoff = 0.0
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except ApiException as exc:
                if exc.status == 410:  # our resourceVersion is too old: relist now
                    logger.info("watch expired (410); relisting")
                    continue
                backoff = self._wait(backoff, f"API error {exc.status}: {exc.reason}")
            except Exception as exc:
                backoff = self._wait(backoff, repr(exc))

    def _wait(self, backoff: float, why: str) -> float:
        backoff = self.backoff_initial if backoff <= 0 else min(self.backoff_max, backoff * 2)
        logger.warning("EndpointSlice discovery failed (%s); retrying in %.1fs", why, backoff)
        self._stop.wait(backoff)
        return backoff


def own_namespace(default: str = "default") -> str:
    """The pod's namespace from its service account mount, else `default`."""
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or default
    except OSError:
        return default
