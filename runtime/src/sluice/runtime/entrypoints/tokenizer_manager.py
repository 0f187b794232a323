"""`TokenizerManager`: the API server's side of the ZeroMQ pipeline.

It sends tokenized requests to the scheduler, receives text deltas from the detokenizer,
and hands each request's updates to the HTTP handler that waits for them. Closing a
request's generator early (client gone) sends an abort, so the scheduler frees its slot
and KV pages.

Every request gets an id of its own here; a client's id (`/generate`'s `rid`) is only a
name for it, so a reused client id can never meet an older request's messages inside.

No client is left without an answer: past `--request-timeout` a request ends with a
'timeout' finish (and is aborted in the scheduler); when the engine goes down (a child
process died, the watchdog found it hung) `engine_down` ends every request with an
'error' finish; a request over the admission limit is refused before it is sent
(`request_limits.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from sluice.runtime.entrypoints.request_limits import (
    EngineDown,
    Overloaded,
    RequestLimits,
    TooManyChoices,
)
from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    DisaggHandoff,
    FinishReason,
    SamplingParams,
    SchedulerReady,
    SchedulerStats,
    TextUpdate,
    TokenizedGenerateReq,
)
from sluice.runtime.ipc.sockets import PortArgs, push_socket, recv_async, send

logger = logging.getLogger("sluice.tokenizer_manager")


# the message of a request ended through POST /abort_request (reported in band, not an error)
ABORTED_BY_REQUEST = "aborted through /abort_request"
WARMUP_RID = "warmup"  # the server's own first generation (launch.warm_up)


@dataclass
class GenerateChunk:
    """One update for one request."""

    text: str
    token_ids: list[int]
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list[float]
    # per new token: the k best (token id, logprob), best first (top_logprobs_num > 0)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    # prompt logprobs (logprob_start_len >= 0), in the first update only
    input_logprobs: list[float] = field(default_factory=list)


@dataclass
class _ReqState:
    queue: asyncio.Queue[GenerateChunk] = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    abort_requested: bool = False
    admitted: bool = True  # counts towards the admission limit
    ended: bool = False  # answered here (timeout, engine down): later updates are dropped
    last: GenerateChunk | None = None  # the latest update, for the counts of an answer made here


class TokenizerManager:
    def __init__(
        self,
        tokenizer: Any,
        served_model_name: str,
        ready: SchedulerReady,
        port_args: PortArgs,
        limits: RequestLimits | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.ready_info = ready
        self.limits = limits or RequestLimits()
        self.context_len = ready.context_len
        self.vocab_size = ready.vocab_size  # the model's: every token id must be below it
        self.features = frozenset(ready.features)
        self.is_ready = False
        self.draining = False
        self.down: str | None = None  # why the engine is down (then nothing is served)
        self.stats = SchedulerStats(max_total_tokens=ready.max_total_tokens)
        # when the pipeline last sent anything (monotonic): the scheduler's heartbeat, its
        # stats at least once a second while it runs its loop (scheduler/process.py)
        self.heard_at = time.monotonic()
        self._admitted = 0  # requests in flight that count towards the admission limit
        self.processes: dict[str, int] = {}  # the engine's processes: name -> pid
        self._ctx = zmq.asyncio.Context()
        # sends never block (PUSH to a bound peer), so a plain socket keeps aborts
        # deliverable from `finally` blocks even while a task is being cancelled
        self._sync_ctx = zmq.Context()
        self._to_scheduler = push_socket(self._sync_ctx, port_args.scheduler_input)
        self._from_detokenizer = self._ctx.socket(zmq.PULL)
        self._from_detokenizer.setsockopt(zmq.LINGER, 0)
        self._from_detokenizer.bind(port_args.tokenizer_input)
        self._states: dict[str, _ReqState] = {}  # by internal id
        self._client_rids: dict[str, str] = {}  # a client's id -> the internal id
        self._loop_task: asyncio.Task[None] | None = None
        # objects with on_chunk(rid, chunk, state), on_stats(stats) and optionally
        # on_abort(rid, state) (the request ended unfinished: its client went away)
        self.listeners: list[Any] = []

    @property
    def num_inflight(self) -> int:
        return len(self._states)

    def send_to_scheduler(self, msg: object) -> None:
        send(self._to_scheduler, msg)

    def scheduler_stalled(self, timeout_s: float) -> bool:
        """Requests are waiting on a scheduler that has been silent for over `timeout_s`
        (read by /health/live and by the watchdog)."""
        return self.num_inflight > 0 and time.monotonic() - self.heard_at > timeout_s

    def check_admission(self, n: int) -> None:
        """Raise `Overloaded` if `n` more requests would exceed the admission limit, and
        `TooManyChoices` if they never could (a retry would be refused again)."""
        if self.down is not None:
            raise EngineDown(f"the engine is down: {self.down}")
        capacity = self.limits.capacity
        if capacity and n > capacity:
            raise TooManyChoices(
                f"This request asks for {n} choices (prompts x n); the server admits at most "
                f"{capacity} at once (--max-running-requests + --max-queued-requests)."
            )
        if capacity and self._admitted + n > capacity:
            for listener in self.listeners:
                if hasattr(listener, "on_reject"):
                    listener.on_reject(n)
            logger.info("request rejected reason=overloaded in-flight=%d limit=%d",
                        self._admitted, capacity)  # fmt: skip
            raise Overloaded(
                f"The server is overloaded: {self._admitted} requests are running or queued "
                f"(at most {capacity}: --max-running-requests + --max-queued-requests). "
                "Retry later."
            )

    def engine_down(self, reason: str) -> None:
        """The engine is gone: answer every request in flight with an error naming
        `reason`, and refuse new ones."""
        if self.down is not None:
            return
        self.down = reason
        self.is_ready = False
        for internal, state in list(self._states.items()):
            self._end(internal, state, FinishReason("error", message=reason))

    def start(self) -> None:
        """Start receiving; call from inside the server's event loop."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._receive_loop())

    def server_info(self) -> dict[str, Any]:
        r = self.ready_info
        return {
            "served_model_name": self.served_model_name,
            "max_total_tokens": r.max_total_tokens,
            "max_running_requests": r.max_running_requests,
            "context_len": r.context_len,
            "max_model_len": r.context_len,
            "model_context_len": r.model_context_len or r.context_len,
            "page_size": r.page_size,
            "device": r.device,
            "dtype": r.dtype,
            "dtype_reason": r.dtype_reason,
            "kv_cache_dtype": r.kv_cache_dtype,
            "quantization": r.quantization,
            "torch_threads": r.torch_threads,
            "tensor_parallel_size": r.tensor_parallel_size,
            "attention_backend": r.attention_backend,
            "is_ready": self.is_ready,
            "draining": self.draining,
            "inflight_requests": self.num_inflight,
            "engine_down": self.down,
            "processes": self.processes,
        }

    async def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str | None = None,
        admit: bool = True,
        handoff: DisaggHandoff | None = None,
    ) -> AsyncIterator[GenerateChunk]:
        """The request's updates, its finish last. Raises before its first update (so the
        HTTP layer can still answer with a status): ValueError for a request that cannot be
        served, `Overloaded` past the admission limit (unless `admit` is False: the
        server's own requests), `EngineDown` once the engine is gone."""
        if admit:
            self.check_admission(1)
        elif self.down is not None:
            raise EngineDown(f"the engine is down: {self.down}")
        if rid is not None and rid in self._client_rids:
            raise ValueError(f"request id {rid} is already in flight")
        if not input_ids:
            raise ValueError("the prompt is empty")
        if len(input_ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(input_ids)} tokens; this model's context length is "
                f"{self.context_len}"
            )
        state = _ReqState(admitted=admit)
        internal = uuid.uuid4().hex
        self._states[internal] = state
        self._admitted += admit
        if rid is not None:
            self._client_rids[rid] = internal
        finished = False
        timeout = self.limits.request_timeout_s
        timer = (
            asyncio.get_running_loop().call_later(timeout, self._expire, internal)
            if timeout > 0
            else None
        )
        try:
            self.send_to_scheduler(
                TokenizedGenerateReq(internal, list(input_ids), sampling, time.time(), handoff)
            )
            while True:
                chunk = await state.queue.get()
                finished = chunk.finished is not None
                yield chunk
                if finished:
                    return
        finally:
            if timer is not None:
                timer.cancel()
            self._states.pop(internal, None)
            self._admitted -= admit
            if rid is not None:
                self._client_rids.pop(rid, None)
            if not finished:
                logger.info("request aborted rid=%s reason=client-gone", rid or internal)
                self.send_to_scheduler(AbortReq(internal))
                for listener in self.listeners:
                    if hasattr(listener, "on_abort"):
                        listener.on_abort(internal, state)

    def abort(self, rid: str) -> list[str]:
        """POST /abort_request: end the request the client named `rid` and its n>1 choices
        (`rid-0`, ...); their generators then finish with an in-band abort. Returns the
        client rids aborted."""
        named = [r for r in self._client_rids if r == rid or _is_choice_of(r, rid)]
        return self._abort(named)

    def abort_all(self) -> list[str]:
        named = {internal: client for client, internal in self._client_rids.items()}
        everything = [named.get(i, i) for i in self._states if named.get(i) != WARMUP_RID]
        return self._abort(everything)

    def _abort(self, rids: list[str]) -> list[str]:
        for rid in rids:
            internal = self._client_rids.get(rid, rid)
            state = self._states.get(internal)
            if state is None:
                continue
            state.abort_requested = True
            logger.info("request aborted rid=%s reason=abort-request", rid)
            self.send_to_scheduler(AbortReq(internal))
        return rids

    async def prefill_only(self, input_ids: list[int]) -> None:
        """Compute a prompt's KV into the prefix cache, generating nothing (n > 1: the
        choices then share it instead of each prefilling it)."""
        try:
            async for _ in self.generate(input_ids, SamplingParams(max_new_tokens=0), admit=False):
                pass
        except (ValueError, EngineDown):
            pass  # the request itself will be refused with the same reason

    def _expire(self, internal: str) -> None:
        """`--request-timeout` passed: abort the request in the scheduler (its pages are
        freed) and answer its client."""
        state = self._states.get(internal)
        if state is None or state.ended:
            return
        timeout = self.limits.request_timeout_s
        logger.info("request aborted rid=%s reason=timeout after=%gs", internal, timeout)
        self.send_to_scheduler(AbortReq(internal))
        message = f"The request did not finish within --request-timeout ({timeout:g} s)."
        self._end(internal, state, FinishReason("timeout", message=message))

    def _end(self, internal: str, state: _ReqState, reason: FinishReason) -> None:
        """Finish a request here, without the scheduler."""
        last = state.last
        chunk = GenerateChunk(
            text="",
            token_ids=[],
            finished=reason,
            prompt_tokens=last.prompt_tokens if last else 0,
            completion_tokens=last.completion_tokens if last else 0,
            cached_tokens=last.cached_tokens if last else 0,
            logprobs=[],
        )
        state.ended = True
        for listener in self.listeners:
            listener.on_chunk(internal, chunk, state)
        state.queue.put_nowait(chunk)

    async def _receive_loop(self) -> None:
        while True:
            msg = await recv_async(self._from_detokenizer)
            self.heard_at = time.monotonic()
            if isinstance(msg, BatchStrOut):
                self._dispatch(msg)
            elif isinstance(msg, SchedulerStats):
                self.stats = msg
                for listener in self.listeners:
                    listener.on_stats(msg)
            else:  # e.g. the answer to a LoRA load (entrypoints/lora_api.py)
                for listener in self.listeners:
                    if hasattr(listener, "on_message"):
                        listener.on_message(msg)

    def _dispatch(self, out: BatchStrOut) -> None:
        for u in out.updates:
            state = self._states.get(u.rid)
            if state is None or state.ended:  # aborted (the client is gone) or answered here
                continue
            finished = u.finished
            if state.abort_requested and finished is not None and finished.kind == "abort":
                finished = FinishReason("abort", message=ABORTED_BY_REQUEST)
            chunk = GenerateChunk(
                text=u.text,
                token_ids=u.new_token_ids,
                finished=finished,
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                cached_tokens=u.cached_tokens,
                logprobs=u.logprobs,
                top_logprobs=_top_pairs(u),
                input_logprobs=u.input_token_logprobs,
            )
            for listener in self.listeners:
                listener.on_chunk(u.rid, chunk, state)
            state.last = chunk
            state.queue.put_nowait(chunk)

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._ctx.destroy(linger=0)
        self._sync_ctx.destroy(linger=0)


def _is_choice_of(rid: str, parent: str) -> bool:
    head, sep, tail = rid.rpartition("-")
    return bool(sep) and head == parent and tail.isdigit()


def _top_pairs(u: TextUpdate) -> list[list[tuple[int, float]]]:
    return [
        list(zip(ids, values, strict=True))
        for ids, values in zip(u.top_logprob_ids, u.top_logprob_values, strict=True)
    ]
