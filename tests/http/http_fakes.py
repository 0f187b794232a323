"""A scripted stand-in for the TokenizerManager, and helpers to drive the app."""

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.entrypoints.request_limits import Overloaded, TooManyChoices
from sluice.runtime.entrypoints.tokenizer_manager import ABORTED_BY_REQUEST, GenerateChunk
from sluice.runtime.ipc.messages import FinishReason

MODEL = "tiny-chat"
CONTEXT_LEN = 64
REPLY = ["Hello", " world", "!"]


@dataclass
class FakeTM:
    """Replies REPLY one piece per chunk (cut short at max_new_tokens, with 'length');
    records every request, and the rids closed before they finished (aborted).

    `reply_ids`: token ids per piece (default 10, 11, ...); `top_logprobs`: when asked for,
    the top list per piece (hand-made); `abort(rid)` ends a hanging request in band."""

    tokenizer: Any
    served_model_name: str = MODEL
    context_len: int = CONTEXT_LEN
    is_ready: bool = True
    draining: bool = False
    down: str | None = None  # why the engine is down
    stats: Any = None  # the scheduler's latest SchedulerStats (none yet)
    reply: list[str] = field(default_factory=lambda: list(REPLY))
    finish: FinishReason = field(default_factory=lambda: FinishReason("stop", matched_token=2))
    hang: bool = False  # after the reply, wait forever instead of finishing
    reject: str | None = None  # raise ValueError(reject) up front
    cached_tokens: int = 3
    requests: list[tuple[list[int], Any, str]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    features: frozenset[str] = frozenset()
    reply_ids: list[list[int]] | None = None
    logprob_values: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    input_logprobs: list[float] | None = None
    live: dict[str, asyncio.Event] = field(default_factory=dict)

    prefills: list[list[int]] = field(default_factory=list)  # prefill_only calls (n > 1)
    vocab_size: int = 0  # 0: the tokenizer's size
    capacity: int = 0  # admission limit on requests in flight (0: none)
    rejected: int = 0  # requests refused by it
    listeners: list[Any] = field(default_factory=list)
    to_scheduler: list[object] = field(default_factory=list)  # what the LoRA routes sent

    def __post_init__(self):
        self.vocab_size = self.vocab_size or len(self.tokenizer)

    def scheduler_stalled(self, timeout_s):
        return False

    def send_to_scheduler(self, msg):
        self.to_scheduler.append(msg)

    def check_admission(self, n):  # as TokenizerManager.check_admission
        if self.capacity and n > self.capacity:
            raise TooManyChoices(f"{n} choices; the server admits at most {self.capacity}")
        if self.capacity and len(self.live) + n > self.capacity:
            self.rejected += n
            raise Overloaded("The server is overloaded.")

    async def prefill_only(self, input_ids):
        self.prefills.append(list(input_ids))

    def abort(self, rid):
        hit = [r for r in self.live if r == rid or r.startswith(f"{rid}-")]
        for r in hit:
            self.live[r].set()
        return hit

    def abort_all(self):
        return self.abort_prefix()

    def abort_prefix(self):
        for e in self.live.values():
            e.set()
        return list(self.live)

    def server_info(self) -> dict[str, Any]:
        return {"context_len": self.context_len, "inflight_requests": 0}

    async def generate(self, input_ids, sampling, rid=None, handoff=None):
        if self.reject:
            raise ValueError(self.reject)
        self.requests.append((list(input_ids), sampling, rid))
        pieces = self.reply[: sampling.max_new_tokens]
        finish = self.finish if len(pieces) == len(self.reply) else FinishReason("length")
        done = False
        stop = self.live[rid] = asyncio.Event()
        try:
            for i, text in enumerate(pieces):
                await asyncio.sleep(0)
                last = i == len(pieces) - 1 and not self.hang
                done = last
                ids = self.reply_ids[i] if self.reply_ids else [10 + i]
                lp = self.logprob_values[i] if self.logprob_values else -0.5
                k = sampling.top_logprobs_num
                yield GenerateChunk(
                    text=text,
                    token_ids=ids,
                    finished=finish if last else None,
                    prompt_tokens=len(input_ids),
                    completion_tokens=i + 1,
                    cached_tokens=self.cached_tokens,
                    logprobs=[lp] * len(ids) if sampling.logprobs else [],
                    top_logprobs=[self.top_logprobs[i][:k]] if k and self.top_logprobs else [],
                    input_logprobs=(self.input_logprobs or [])
                    if i == 0 and sampling.logprob_start_len >= 0
                    else [],
                )
            if self.hang:
                await stop.wait()
                done = True
                yield GenerateChunk("", [], FinishReason("abort", message=ABORTED_BY_REQUEST),
                                    len(input_ids), len(pieces), 0, [])
        finally:
            self.live.pop(rid, None)
            if not done:
                self.aborted.append(rid)


def sse_events(response) -> list[Any]:
    """The decoded `data:` payloads of an SSE response ('[DONE]' kept as a string)."""
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def call_asgi(app, path: str, body: dict, disconnect_after_chunks: int) -> list[dict]:
    """Drive `app` directly, as a client that sends `body` and hangs up after it has seen
    `disconnect_after_chunks` non-empty body chunks (0: right after sending the request)."""
    sent: list[dict] = []
    hang_up = asyncio.Event()
    request_sent = False
    if disconnect_after_chunks == 0:
        hang_up.set()

    async def receive():
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if len(chunks) >= disconnect_after_chunks:
            hang_up.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 5)
    return sent


def chat_with_reasoning(client: Any, stream: bool, **kwargs: Any) -> tuple[Any, str, list[Any]]:
    """One chat completion through the openai client, streamed or whole: (the final
    completion, its reasoning_content, the streamed chunks; none when whole)."""
    if not stream:
        final = client.chat.completions.create(**kwargs)
        return final, final.choices[0].message.model_extra["reasoning_content"], []
    with client.chat.completions.stream(**kwargs) as events:
        chunks = [e.chunk for e in events if e.type == "chunk"]
        final = events.get_final_completion()
    reasoning = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                        for c in chunks if c.choices)  # fmt: skip
    return final, reasoning, chunks
