"""A Kubernetes API emulator for EndpointSlices, on kmock (like tests/operator's, which
this does not import: that one serves the operator's resources).

kmock 0.8's KubernetesEmulator stores objects and streams watch events; this adds what a
client of EndpointSlices relies on from a real API server:
- `metadata.resourceVersion` on every write, and a list's `metadata.resourceVersion`;
- equality label selectors (`?labelSelector=k=v,k2=v2`) on list and watch;
- a watch sees every change after it starts (the bus is marked before the snapshot of the
  current objects is taken, under the emulator's lock, so nothing falls between).

The emulator runs on its own event loop in a thread and is reached over HTTP.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import kmock

ENDPOINTSLICES = "discovery.k8s.io/v1/endpointslices"
ENDPOINTSLICE_INFO = kmock.ResourceInfo(
    kind="EndpointSlice",
    namespaced=True,
    verbs={"create", "get", "list", "watch", "patch", "delete"},
)


CLOSE: dict[str, Any] = {"type": "CLOSE"}  # put on the buses to end open watches


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


@attrs.define(kw_only=True)
class SliceEmulator(kmock.KubernetesEmulator):
    watches: int = attrs.field(default=0, init=False)
    _versions = itertools.count(1)

    async def _handle(self, request: kmock.Request) -> Any:
        if request.resource is not None and request.action in (
            kmock.action.CREATE, kmock.action.UPDATE
        ) and isinstance(request.data, dict):  # fmt: skip
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
        return await super()._handle(request)

    def _matches(self, request: kmock.Request, raw: Mapping[str, Any]) -> bool:
        meta = raw.get("metadata", {})
        if request.namespace is not None and meta.get("namespace") != request.namespace:
            return False
        return selector_matches(request.params.get("labelSelector", ""), meta.get("labels") or {})

    async def _serve_list(self, request: kmock.Request) -> Any:
        async with self._lock:
            items = [
                copy.deepcopy(o.raw)
                for (res, _, _), o in self._objects.items()
                if res == request.resource and not o.deleted and self._matches(request, o.raw)
            ]
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList",
                "metadata": {"resourceVersion": str(next(self._versions))}, "items": items}  # fmt: skip

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        yield b""
        self.watches += 1
        bus = self._buses[request.resource]
        async with self._lock:
            mark = await bus.mark()
            current = [
                copy.deepcopy(o.raw)
                for (res, _, _), o in self._objects.items()
                if res == request.resource and not o.deleted and self._matches(request, o.raw)
            ]
        for raw in current:  # a resync: the client's state converges whatever it had
            yield {"type": "ADDED", "object": raw}
        async for event in bus.stream(since=mark):
            if event is CLOSE:  # the emulator is shutting down: end the watch
                return
            if self._matches(request, event.get("object", {})):
                yield event


class Cluster:
    """The emulator served on a local port from a background event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the API emulator did not start")

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with SliceEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            emulator.resources[ENDPOINTSLICES] = ENDPOINTSLICE_INFO
            self._started.set()
            await self._stop.wait()
            for bus in list(emulator._buses.values()):
                await bus.put(CLOSE)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Any) -> Any:
        import yaml

        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}],
            "current-context": "kmock",
        }))  # fmt: skip
        return path
