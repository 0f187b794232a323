"""The scheduler's side of LoRA, one owned `AdapterGate`: load and unload adapters on the
worker (every tensor-parallel rank replays the same messages), refuse requests for an
adapter the worker does not hold, and report adapters per request state.

The gate is handed the worker's `LoraManager` (or None with LoRA off) by the composition root
(`scheduler.process.build_scheduler`); it reads nothing of the scheduler.

The batch limit itself (at most `--max-loras` distinct adapters in a batch) is admission's
(`prefill.py`): every running request decodes in every batch, so a waiting request whose
adapter would be one too many is not admitted, and admission stops there (no skipping
ahead), which is what keeps it from starving: the running adapters drain, nothing new
passes it, so it is admitted as soon as one of them has no requests left.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.ipc.messages import LoadLoraReq, LoraOpResult, UnloadLoraReq
from sluice.runtime.scheduler.request import Req

logger = logging.getLogger("sluice.scheduler")

LORA_OFF = "LoRA is off: start the server with --enable-lora"


@dataclass
class AdapterGate:
    manager: Any = None  # the worker's LoraManager; None: LoRA is off
    replies: list[LoraOpResult] = field(default_factory=list)  # answers not yet sent

    def handle(self, msg: LoadLoraReq | UnloadLoraReq, live: Iterable[Req]) -> None:
        """Carry out `msg` and keep its answer for `take_replies`."""
        self.replies.append(self.op(msg, live))

    def take_replies(self) -> list[LoraOpResult]:
        replies, self.replies = self.replies, []
        return replies

    def op(self, msg: LoadLoraReq | UnloadLoraReq, live: Iterable[Req]) -> LoraOpResult:
        """Load or unload an adapter; an unload waits (409) while `live` requests use it."""
        if self.manager is None:
            return LoraOpResult(msg.op_id, False, 400, LORA_OFF)
        if isinstance(msg, LoadLoraReq):
            try:
                seconds = self.manager.register(msg.lora_id, msg.name, msg.path)
            except ValueError as exc:
                logger.info("lora adapter refused name=%s path=%s reason=%s", msg.name, msg.path, exc)
                return LoraOpResult(
                    msg.op_id, False, 400, f"cannot load LoRA adapter {msg.name!r}: {exc}"
                )
            except Exception as exc:  # an unexpected fault: the adapter is not served
                logger.exception("lora adapter load failed name=%s", msg.name)
                return LoraOpResult(
                    msg.op_id, False, 500, f"loading LoRA adapter {msg.name!r} failed: {exc!r}"
                )
            return LoraOpResult(msg.op_id, True, 200, "", seconds)
        using = [r.rid for r in live if r.sampling.lora_id == msg.lora_id]
        if using:
            return LoraOpResult(
                msg.op_id, False, 409,
                f"{len(using)} requests are using the adapter; retry when they end",
            )  # fmt: skip
        self.manager.unregister(msg.lora_id)
        return LoraOpResult(msg.op_id, True, 200)

    def unknown(self, lora_id: int) -> str:
        """Why a request for `lora_id` cannot be served here ("" when it can)."""
        if lora_id == 0:
            return ""
        if self.manager is None:
            return LORA_OFF
        if lora_id not in self.manager.registered:
            return f"LoRA adapter id {lora_id} is not loaded (unloaded meanwhile?)"
        return ""

    def stats(self, running: Iterable[Req], waiting: Iterable[Req]) -> dict[str, Any]:
        """`SchedulerStats`' LoRA fields: --max-loras, adapters loaded, running and waiting
        requests per adapter name."""
        if self.manager is None:
            return {}
        names = self.manager.names

        def count(reqs: Iterable[Req]) -> dict[str, int]:
            ids = Counter(r.sampling.lora_id for r in reqs if r.sampling.lora_id)
            return {names.get(i, str(i)): n for i, n in ids.items()}

        return {
            "lora_max": self.manager.config.max_loras,
            "lora_loaded": len(names),
            "lora_running": count(running),
            "lora_waiting": count(waiting),
        }
