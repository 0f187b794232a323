"""What the API server refuses or cuts short to stay responsive under overload: the
admission limit (`--max-queued-requests`), the per-request deadline (`--request-timeout`)
and the engine being down. Raised by the TokenizerManager, answered by the HTTP layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

RETRY_AFTER_S = 1  # the Retry-After of a 503 for a full server


@dataclass(frozen=True)
class RequestLimits:
    # requests (choices) in flight at most: --max-running-requests + --max-queued-requests
    # (0: no limit)
    capacity: int = 0
    request_timeout_s: float = 0.0  # from arrival; 0: none

    @classmethod
    def from_args(cls, args: Any) -> RequestLimits:
        queued = args.max_queued_requests
        capacity = 0 if queued < 0 else args.max_running_requests + queued
        return cls(capacity=capacity, request_timeout_s=args.request_timeout)


class Overloaded(Exception):
    """The server holds as many requests as it admits: refused at once (503)."""

    retry_after_s = RETRY_AFTER_S


class TooManyChoices(ValueError):
    """A request with more choices than the server ever admits at once (400: retrying
    cannot help, so not a 503)."""


class EngineDown(Exception):
    """The engine (scheduler or detokenizer) is gone or hung: nothing can be served (503)."""
