"""Per-batch fault isolation: what the scheduler does when a forward fails, and when the
engine cannot go on.

A forward (model or sampling) that raises loses one batch, not the server: that batch's
requests end with an 'error' finish naming the cause (the API answers 500), the KV the
forward was writing is dropped (it never reaches the prefix cache), the in-flight forward
is let finish and the pool's books are checked. A fault that leaves the engine unusable
(`engine_faults.is_unrecoverable`: a CUDA error), an integrity check that fails, or any
exception in the scheduler's own bookkeeping raises `EngineDead`: the process answers
every request it holds and exits non-zero, and the server goes down with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from sluice.runtime.engine.engine_faults import is_unrecoverable
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.ipc.sockets import send
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req

logger = logging.getLogger("sluice.scheduler")

FLUSH_LINGER_MS = 2000  # how long the last answers may take to leave a dying scheduler


class EngineDead(RuntimeError):
    """The engine cannot serve any more requests."""


def batch_error(exc: BaseException) -> FinishReason:
    return FinishReason(
        "error", message=f"the engine failed on this request's batch: {type(exc).__name__}: {exc}"
    )




def fail_batch(
    batch: ScheduledBatch,
    exc: Exception,
    cache: KVCacheManager,
    finish: Callable[[Req, FinishReason], None],
) -> None:
    """The forward of `batch` raised: its requests end with an error naming the cause and
    the KV it was writing is dropped (each keeps only the positions earlier forwards
    computed, so releasing it caches nothing the failed one wrote); raises `EngineDead`
    when the engine cannot go on."""
    rids = [r.rid for r in batch.reqs]
    logger.error("forward failed: %d requests end with an error rids=%s", len(rids), rids,
                 exc_info=exc)  # fmt: skip
    for req, start in zip(batch.reqs, batch.starts, strict=True):
        cache.roll_back(req, start)
    reason = batch_error(exc)
    for req in batch.reqs:
        if not req.is_finished:
            finish(req, reason)
    if is_unrecoverable(exc):
        raise EngineDead(f"unrecoverable engine fault: {type(exc).__name__}: {exc}") from exc


def answer_everyone(scheduler: Any, outbox: zmq.Socket, exc: BaseException) -> None:
    """The engine is going down: end every request the scheduler holds with an error
    naming `exc`, and send those answers before the process exits."""
    reason = FinishReason(
        "error", message=f"the engine failed and the server is shutting down: {exc}"
    )
    try:
        scheduler.fail_all(reason)
        out = scheduler.take_output()
        if out is not None:
            outbox.setsockopt(zmq.LINGER, FLUSH_LINGER_MS)
            send(outbox, out)
            outbox.close()
    except Exception:  # the API server answers whoever is left when this process exits
        logger.exception("could not answer the requests before exiting")

