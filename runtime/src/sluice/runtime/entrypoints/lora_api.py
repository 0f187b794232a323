"""LoRA adapters at the API: which `model` names an adapter, and vLLM's run-time routes.

`LoraAdapters` is the API server's table of adapters (name -> folder, id). It numbers
the `--lora-modules` adapters 1, 2, ... as the scheduler's worker does, and gives each
later load a fresh id (never reused: the scheduler's radix keys and the worker's slots are
per id, so a reloaded adapter can never see an older one's KV or weights).

- `POST /v1/load_lora_adapter {"lora_name", "lora_path"}`: the scheduler reads and
  validates the adapter (every tensor-parallel rank); 200 `Success: LoRA adapter 'x' added
  successfully.`, 400 naming why it was refused, or that the name is taken.
- `POST /v1/unload_lora_adapter {"lora_name"}`: new requests for it get 404 at once; the
  unload waits (up to `--drain-timeout`) for the requests already using it to end, then
  answers 200 `Success: LoRA adapter 'x' removed successfully.`; past the wait it answers
  409 and the adapter stays served. 404 for a name that is not loaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from sluice.runtime.entrypoints.api_config import ApiConfig
from sluice.runtime.entrypoints.errors import ProtocolError
from sluice.runtime.entrypoints.json_body import load_json_body
from sluice.runtime.ipc.messages import LoadLoraReq, LoraOpResult, UnloadLoraReq
from sluice.runtime.lora.spec import LoraAdapterError, check_name, parse_lora_modules

logger = logging.getLogger("sluice.lora")

OP_TIMEOUT_S = 300.0  # a load reads the adapter's files on every rank
UNLOAD_RETRY_S = 0.05


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/load_lora_adapter body."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/unload_lora_adapter body."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    lora_id: int
    base_model_name: str = ""
    created: int = field(default_factory=lambda: int(time.time()))


class SchedulerLink(Protocol):
    """What the LoRA routes use of the TokenizerManager: its listeners (the scheduler's
    answers arrive there) and its way to the scheduler."""

    listeners: list[Any]

    def send_to_scheduler(self, msg: object) -> None: ...


class LoraAdapters:
    """The adapters this server serves; a TokenizerManager listener (`on_message`) for the
    scheduler's answers to loads and unloads."""

    def __init__(self, tm: SchedulerLink, args: ApiConfig) -> None:
        self.tm = tm
        self.enabled = args.enable_lora
        self.wait_s = max(args.drain_timeout, 1.0)
        self.adapters: dict[str, Adapter] = {}
        specs = parse_lora_modules(args.lora_modules) if args.enable_lora else []
        for lora_id, spec in enumerate(specs, start=1):
            self.adapters[spec.name] = Adapter(spec.name, spec.path, lora_id, spec.base_model_name)
        self._next_id = len(specs) + 1
        self._busy: set[str] = set()  # names being loaded or unloaded
        self._pending: dict[str, asyncio.Future[LoraOpResult]] = {}
        tm.listeners.append(self)

    # ---- lookups ------------------------------------------------------------------------
    def get(self, name: str | None) -> Adapter | None:
        """The adapter a request's `model` (or `lora_name`) names; None if none is served
        under that name (or it is being unloaded)."""
        if not name or name in self._busy:
            return None
        return self.adapters.get(name)

    def by_name_or_path(self, value: str) -> Adapter | None:
        """SGLang's `lora_path`: an adapter's name, or the folder it was loaded from."""
        found = self.get(value)
        if found is not None:
            return found
        for a in self.adapters.values():
            if a.path == value and a.name not in self._busy:
                return a
        return None

    # ---- TokenizerManager listener ------------------------------------------------------
    def on_message(self, msg: object) -> None:
        if isinstance(msg, LoraOpResult):
            future = self._pending.pop(msg.op_id, None)
            if future is not None and not future.done():
                future.set_result(msg)

    def on_chunk(self, rid: str, chunk: Any, state: Any) -> None:
        pass

    def on_stats(self, stats: Any) -> None:
        pass

    async def _ask(self, msg: LoadLoraReq | UnloadLoraReq) -> LoraOpResult:
        future: asyncio.Future[LoraOpResult] = asyncio.get_running_loop().create_future()
        self._pending[msg.op_id] = future
        self.tm.send_to_scheduler(msg)
        try:
            return await asyncio.wait_for(future, OP_TIMEOUT_S)
        except asyncio.TimeoutError:
            self._pending.pop(msg.op_id, None)
            return LoraOpResult(msg.op_id, False, 503, "the scheduler did not answer")

    # ---- routes -------------------------------------------------------------------------
    async def _body(self, request: Request, fields: set[str]) -> dict[str, Any]:
        if not self.enabled:
            raise ProtocolError("LoRA is off: start the server with --enable-lora.", status=400)
        data = load_json_body(await request.body())
        if not isinstance(data, dict):
            raise ProtocolError("The request body must be a JSON object.", code="invalid_json")
        for name in data:
            if name not in fields:
                raise ProtocolError(f"Unrecognized request argument supplied: {name}",
                                      param=name, code="unsupported_parameter")  # fmt: skip
        return data

    async def load(self, request: Request) -> PlainTextResponse:
        data = await self._body(request, {"lora_name", "lora_path"})
        name, path = data.get("lora_name"), data.get("lora_path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise ProtocolError("Both 'lora_name' and 'lora_path' must be provided.")
        try:
            check_name(name)
        except LoraAdapterError as exc:
            raise ProtocolError(str(exc), param="lora_name") from exc
        if name in self.adapters or name in self._busy or name == self.tm.served_model_name:
            raise ProtocolError(f"The lora adapter '{name}' has already been loaded.",
                                  param="lora_name")  # fmt: skip
        self._busy.add(name)
        try:
            lora_id = self._next_id
            self._next_id += 1
            result = await self._ask(LoadLoraReq(uuid.uuid4().hex, lora_id, name, path))
            if not result.ok:
                raise ProtocolError(result.message, status=result.status, param="lora_path",
                                      type="invalid_request_error" if result.status < 500 else "server_error")  # fmt: skip
            self.adapters[name] = Adapter(name, path, lora_id)
        finally:
            self._busy.discard(name)
        logger.info("lora adapter served name=%s id=%d path=%s", name, lora_id, path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: Request) -> PlainTextResponse:
        data = await self._body(request, {"lora_name"})
        name = data.get("lora_name")
        if not isinstance(name, str) or not name:
            raise ProtocolError("'lora_name' must be provided.")
        adapter = self.adapters.get(name)
        if adapter is None or name in self._busy:
            raise ProtocolError(f"The lora adapter '{name}' cannot be found.", status=404,
                                  param="lora_name", code="model_not_found")  # fmt: skip
        self._busy.add(name)  # new requests for it are refused from here on
        deadline = time.monotonic() + self.wait_s
        try:
            while True:
                result = await self._ask(UnloadLoraReq(uuid.uuid4().hex, adapter.lora_id))
                if result.ok:
                    del self.adapters[name]
                    break
                if result.status != 409 or time.monotonic() >= deadline:
                    raise ProtocolError(result.message, status=result.status, param="lora_name",
                                          code="adapter_in_use" if result.status == 409 else None)  # fmt: skip
                await asyncio.sleep(UNLOAD_RETRY_S)  # its requests are still running
        finally:
            self._busy.discard(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    def cards(self, parent: str) -> list[dict[str, Any]]:
        """`/v1/models` entries: each adapter, with its base model as `parent`."""
        return [
            {"id": a.name, "object": "model", "created": a.created, "owned_by": "sluice",
             "root": a.path, "parent": a.base_model_name or parent}
            for a in self.adapters.values() if a.name not in self._busy
        ]  # fmt: skip
