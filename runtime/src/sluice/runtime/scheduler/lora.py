"""The scheduler's side of LoRA: load and unload adapters on the worker (every
tensor-parallel rank replays the same messages), refuse requests for an adapter the worker
does not hold, and report adapters per request state.

The batch limit itself (at most `--max-loras` distinct adapters in a batch) is admission's
(`prefill.py`): every running request decodes in every batch, so a waiting request whose
adapter would be one too many is not admitted, and admission stops there (no skipping
ahead), which is what keeps it from starving: the running adapters drain, nothing new
passes it, so it is admitted as soon as one of them has no requests left.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from sluice.runtime.ipc.messages import LoadLoraReq, LoraOpResult, UnloadLoraReq

if TYPE_CHECKING:
    from sluice.runtime.scheduler.scheduler import Scheduler

logger = logging.getLogger("sluice.scheduler")


def worker_lora(scheduler: Scheduler) -> Any:
    """The worker's `LoraManager`, or None (LoRA off, or an executor without a worker)."""
    worker = getattr(scheduler.executor, "worker", None)
    return getattr(worker, "lora", None)


def lora_op(scheduler: Scheduler, msg: LoadLoraReq | UnloadLoraReq) -> LoraOpResult:
    manager = worker_lora(scheduler)
    if manager is None:
        return LoraOpResult(
            msg.op_id, False, 400, "LoRA is off: start the server with --enable-lora"
        )
    if isinstance(msg, LoadLoraReq):
        try:
            seconds = manager.register(msg.lora_id, msg.name, msg.path)
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
    using = [r.rid for r in scheduler.live_requests() if r.sampling.lora_id == msg.lora_id]
    if using:
        return LoraOpResult(
            msg.op_id,
            False,
            409,
            f"{len(using)} requests are using the adapter; retry when they end",
        )
    manager.unregister(msg.lora_id)
    return LoraOpResult(msg.op_id, True, 200)


def unknown_adapter(scheduler: Scheduler, lora_id: int) -> str:
    """Why a request for `lora_id` cannot be served here ("" when it can)."""
    if lora_id == 0:
        return ""
    manager = worker_lora(scheduler)
    if manager is None:
        return "LoRA is off: start the server with --enable-lora"
    if lora_id not in manager.registered:
        return f"LoRA adapter id {lora_id} is not loaded (unloaded meanwhile?)"
    return ""


def lora_stats(scheduler: Scheduler) -> dict[str, Any]:
    """`SchedulerStats`' LoRA fields: --max-loras, adapters loaded, running and waiting
    requests per adapter name."""
    manager = worker_lora(scheduler)
    if manager is None:
        return {}
    names = manager.names
    running = list(scheduler.decode.running.values())
    if scheduler.prefill.chunked is not None:
        running.append(scheduler.prefill.chunked)

    def count(reqs: Any) -> dict[str, int]:
        ids = Counter(r.sampling.lora_id for r in reqs if r.sampling.lora_id)
        return {names.get(i, str(i)): n for i, n in ids.items()}

    return {
        "lora_max": manager.config.max_loras,
        "lora_loaded": len(names),
        "lora_running": count(running),
        "lora_waiting": count(scheduler.prefill.waiting),
    }
