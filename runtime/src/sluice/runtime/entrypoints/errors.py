"""The API's errors, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

`ProtocolError` is what a route raises to refuse or fail a request (the app renders it with
its status); `as_protocol_error` turns anything else a generation raised into one, so a
stream can end with an error event of the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from sluice.runtime.entrypoints.message_rules import message_param
from sluice.runtime.entrypoints.request_limits import EngineDown, Overloaded

logger = logging.getLogger("sluice.http")


class ProtocolError(Exception):
    """A request the API refuses; rendered as OpenAI's error JSON with `status`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_validation_error(exc: ValidationError) -> ProtocolError:
    """The first problem pydantic found, as a 400 naming the offending field."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in err["loc"])
    param = str(err["loc"][0]) if err["loc"] else None
    if param == "messages" and len(err["loc"]) >= 3 and isinstance(err["loc"][1], int):
        param = message_param(err["loc"][1], str(err["loc"][2]))  # OpenAI's messages.[i].field
    code = "missing_required_parameter" if err["type"] == "missing" else "invalid_value"
    message = f"{loc}: {err['msg']}" if loc else err["msg"]
    return ProtocolError(message, param=param, code=code)


def model_not_found(model: str) -> ProtocolError:
    return ProtocolError(
        f"The model `{model}` does not exist.", status=404, param="model", code="model_not_found"
    )


def not_supported_yet(param: str, what: str) -> ProtocolError:
    return ProtocolError(
        f"{param}: {what} is not supported yet by this server.",
        param=param,
        code="not_supported_yet",
    )


def as_protocol_error(exc: BaseException) -> ProtocolError:
    """What the client gets for an exception out of a generation: 503 (with Retry-After)
    for a full server, 503 for a dead engine, 400 for the TokenizerManager's up-front
    rejection (a ValueError), else a logged 500."""
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, Overloaded):
        return ProtocolError(
            str(exc), status=503, type="server_error", code="server_overloaded",
            headers={"Retry-After": str(exc.retry_after_s)},
        )  # fmt: skip
    if isinstance(exc, EngineDown):
        return ProtocolError(str(exc), status=503, type="server_error", code="engine_down")
    if isinstance(exc, ValueError):  # the TokenizerManager's up-front rejection
        return ProtocolError(str(exc))
    logger.error("request failed: %r", exc, exc_info=exc)
    return ProtocolError(
        "Internal server error.", status=500, type="server_error", code="internal_error"
    )
