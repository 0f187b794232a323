"""The load generator: streaming `POST /v1/completions` over httpx, one task per request.

Arrivals are a Poisson process (`request_rate` per second; `inf` sends everything at t=0);
`max_concurrency` caps the requests in flight. Like SGLang, a request's clock starts when it
is actually sent, after it got a concurrency slot.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sluice.runtime.workload.arrivals import arrival_offsets
from sluice.runtime.workload.dataset import BenchRequest
from sluice.runtime.workload.metrics import RequestResult

COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
DONE = "[DONE]"


@dataclass(frozen=True)
class LoadConfig:
    url: str  # the completions endpoint
    model: str
    request_rate: float = math.inf
    max_concurrency: int = 0  # 0: no cap
    ignore_eos: bool = True
    seed: int = 1
    api_key: str = ""
    extra_body: dict[str, Any] = field(default_factory=dict)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def build_payload(config: LoadConfig, prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": config.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": config.ignore_eos,
        **config.extra_body,
    }


def parse_sse_line(line: str) -> dict[str, Any] | str | None:
    """One line of a server-sent-event stream: the JSON of a `data:` line, `DONE` for
    `data: [DONE]`, None for anything else (blank lines, comments, other fields).
    Raises ValueError on a `data:` line that is not JSON."""
    line = line.strip()
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if data == DONE:
        return DONE
    try:
        event = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad SSE data: {data[:200]!r}") from exc
    if not isinstance(event, dict):
        raise ValueError(f"SSE data is not an object: {data[:200]!r}")
    return event


@dataclass
class StreamReader:
    """Reads one completion stream line by line and times its chunks from `start`."""

    start: float
    text_parts: list[str] = field(default_factory=list)
    ttft: float | None = None
    last_chunk: float | None = None
    itl: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    done: bool = False
    error: str = ""

    @property
    def finished(self) -> bool:
        return self.done or bool(self.error)

    def feed(self, line: str, now: float) -> None:
        try:
            event = parse_sse_line(line)
        except ValueError as exc:
            self.error = str(exc)
            return
        if event is None:
            return
        if event == DONE:
            self.done = True
            return
        assert isinstance(event, dict)
        self._on_event(event, now)

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        if "error" in event:
            err = event["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)
            return
        choices = event.get("choices") or []
        text = (choices[0].get("text") or "") if choices else ""
        if text:
            if self.ttft is None:
                self.ttft = now - self.start
            else:
                assert self.last_chunk is not None
                self.itl.append(now - self.last_chunk)
            self.last_chunk = now
            self.text_parts.append(text)
        usage = event.get("usage")
        if usage:
            self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
            self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = details.get("cached_tokens", self.cached_tokens)

    def fail(self, error: str) -> None:
        self.error = error

    def result(self, request: BenchRequest, end: float, send_time: float) -> RequestResult:
        error = self.error
        if not error and not self.done:
            error = "stream ended without [DONE]"
        if not error and self.ttft is None:
            error = "no text chunk in the stream"
        if error:
            return RequestResult(
                prompt_len=request.prompt_len,
                output_len=request.output_len,
                success=False,
                e2e=end - self.start,
                send_time=send_time,
                error=error,
            )
        usage = self.completion_tokens is not None
        return RequestResult(
            prompt_len=request.prompt_len,
            output_len=request.output_len,
            success=True,
            output_tokens=self.completion_tokens if usage else len(self.text_parts),
            ttft=self.ttft or 0.0,
            itl=tuple(self.itl),
            e2e=end - self.start,
            send_time=send_time,
            usage_reported=usage,
            server_prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            text="".join(self.text_parts),
        )


async def send_request(
    client: httpx.AsyncClient,
    config: LoadConfig,
    request: BenchRequest,
    bench_start: float,
) -> RequestResult:
    payload = build_payload(config, request.prompt, request.output_len)
    start = time.perf_counter()
    reader = StreamReader(start)
    try:
        async with client.stream("POST", config.url, json=payload, headers=config.headers) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                reader.fail(f"HTTP {resp.status_code}: {body[:300]}")
            else:
                async for line in resp.aiter_lines():
                    reader.feed(line, time.perf_counter())
                    if reader.finished:
                        break
    except Exception as exc:  # a benchmark records failures, it does not stop on them
        reader.fail(f"{type(exc).__name__}: {exc}")
    return reader.result(request, end=time.perf_counter(), send_time=start - bench_start)


def http_client(transport: httpx.AsyncBaseTransport | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    return httpx.AsyncClient(
        timeout=httpx.Timeout(None, connect=30.0), limits=limits, transport=transport
    )


async def warm_up(config: LoadConfig, request: BenchRequest, count: int) -> None:
    """Sends `request` `count` times at once before the clock starts; raises if none
    succeeds (a server that cannot answer one request is not worth timing)."""
    if count < 1:
        return
    async with http_client() as client:
        now = time.perf_counter()
        results = await asyncio.gather(
            *(send_request(client, config, request, now) for _ in range(count))
        )
    if not any(r.success for r in results):
        raise RuntimeError(f"warm-up failed: {results[0].error}")


async def run_load(
    config: LoadConfig,
    requests: Sequence[BenchRequest],
    progress: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[RequestResult], float]:
    """Sends every request on schedule; returns the results in request order and the
    benchmark duration (first send scheduled to last response done). `transport` replaces
    the network (tests)."""
    offsets = arrival_offsets(len(requests), config.request_rate, config.seed)
    slots = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency > 0 else None
    done = 0
    step = max(1, len(requests) // 10)

    async with http_client(transport) as client:
        bench_start = time.perf_counter()

        async def one(request: BenchRequest, offset: float) -> RequestResult:
            nonlocal done
            delay = bench_start + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots is None:
                result = await send_request(client, config, request, bench_start)
            else:
                async with slots:
                    result = await send_request(client, config, request, bench_start)
            done += 1
            if progress and (done % step == 0 or done == len(requests)):
                print(f"  {done}/{len(requests)} requests done", flush=True)
            return result

        results = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets, strict=True)))
        duration = time.perf_counter() - bench_start
    return list(results), duration


async def fetch_model_id(base_url: str, api_key: str = "") -> str | None:
    """The first model id from `GET /v1/models`, or None when the server gives none."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=30.0) as client:
        resp = await client.get(base_url.rstrip("/") + MODELS_PATH, headers=headers)
    if resp.status_code != 200:
        return None
    data = resp.json().get("data") or []
    return data[0].get("id") if data else None
