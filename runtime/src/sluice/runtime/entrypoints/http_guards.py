"""ASGI middleware in front of every route: the API key and the request body size limit.

Both answer in OpenAI's error shape before the app sees the request: 401 for a missing or
wrong key (compared in constant time), 413 for a body over `--max-request-body-bytes`
(by its Content-Length at once, or as the chunks of a body without one arrive).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from fastapi.responses import JSONResponse

from sluice.runtime.entrypoints.errors import error_body


class ApiKeyMiddleware:
    """Every route but `open_paths` (probes, scrapes) needs `Authorization: Bearer KEY`."""

    def __init__(self, app: Any, api_key: str, open_paths: frozenset[str]) -> None:
        self.app = app
        self.digest = hashlib.sha256(api_key.encode()).digest()
        self.open_paths = open_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = error_body("Incorrect API key provided.", code="invalid_api_key")
        await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)

    def _authorized(self, scope: Any) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # digests of equal length: the comparison takes the same time for any token
                given = hashlib.sha256(token.strip()).digest()
                return hmac.compare_digest(given, self.digest) and scheme.lower() == b"bearer"
        return False


class BodyLimitMiddleware:
    """Refuse a request body over `limit` bytes with 413. The body is read here (the app
    reads all of it anyway) and handed on in one piece; later receives (the client's
    disconnect, which a streaming response listens for) pass through."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(scope, receive, send, declared)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # gone before the body arrived
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                await self._refuse(scope, receive, send, None)
                return
            if not message.get("more_body", False):
                break
        handed = False

        async def replay() -> Any:
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Any, receive: Any, send: Any, size: int | None) -> None:
        told = f"is {size} bytes" if size is not None else "is larger than that"
        body = error_body(
            f"The request body {told}; this server accepts at most {self.limit} bytes "
            "(--max-request-body-bytes).",
            code="request_too_large",
        )
        await JSONResponse(body, 413, headers={"Connection": "close"})(scope, receive, send)


def _content_length(scope: Any) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
