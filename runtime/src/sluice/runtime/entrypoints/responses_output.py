"""The Responses API's output: the response object, its output items, and the typed
server-sent events, built from one generation's chunks.

`ResponseAssembler` is fed every chunk, streamed or not, so a streamed and a whole response
carry the same items. Each piece of text opens the item it belongs to, closing the one
before (reasoning, then the message, then each function call, as they come):

    response.created, response.in_progress,
    per item: response.output_item.added,
      message:   response.content_part.added, response.output_text.delta...,
                 response.output_text.done, response.content_part.done
      reasoning: response.content_part.added, response.reasoning_text.delta...,
                 response.reasoning_text.done, response.content_part.done
      function_call: response.function_call_arguments.delta...,
                 response.function_call_arguments.done
    response.output_item.done; then response.completed (response.incomplete when
    max_output_tokens cut it; response.failed when the server could not finish it, or
    with status cancelled when POST /abort_request ended it).

Every event carries `sequence_number`, counting from 0.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.entrypoints.choice_output import ChoiceOutput, OutputPieces
from sluice.runtime.entrypoints.errors import ProtocolError
from sluice.runtime.entrypoints.streaming import Chunk


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def sse(event: dict[str, Any]) -> str:
    """A typed event: its `type` as the SSE event name too, as OpenAI sends them."""
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"


def usage_body(prompt: int, completion: int, cached: int, reasoning: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


@dataclass
class _OpenItem:
    index: int  # output_index
    item: dict[str, Any]
    text: str = ""  # the message's or reasoning's text, or the call's arguments


@dataclass
class ResponseAssembler:
    """`base`: the response object's fields that echo the request (id, model, tools, ...);
    `output`: how the text splits into reasoning, content and calls; `parallel`: more
    than one function call may be output."""

    base: dict[str, Any]
    output: ChoiceOutput
    parallel: bool = True
    created_at: int = field(default_factory=lambda: int(time.time()))
    items: list[dict[str, Any]] = field(default_factory=list)
    seq: int = 0
    reasoning_tokens: int = 0
    _open: _OpenItem | None = None
    _calls: dict[int, _OpenItem] = field(default_factory=dict)  # the parser's call index ->
    last: Chunk = None  # the latest chunk

    # --- the response object ------------------------------------------------------------------
    def response(self, status: str, **extra: Any) -> dict[str, Any]:
        body = {
            "id": self.base["id"],
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            **self.base,
            "output": list(self.items),
            "usage": None,
        }
        body.update(extra)
        return body

    @property
    def cancelled(self) -> bool:
        """Aborted in band (POST /abort_request): it did not finish."""
        return self._finish_kind == "abort"

    @property
    def _finish_kind(self) -> str | None:
        last = self.last
        return last.finished.kind if last is not None and last.finished is not None else None

    def final(self) -> dict[str, Any]:
        """The finished response: completed, incomplete when the length cut it, or
        cancelled when it was aborted."""
        last = self.last
        cut = self._finish_kind == "length"
        usage = None
        if last is not None:
            usage = usage_body(last.prompt_tokens, last.completion_tokens, last.cached_tokens,
                               self.reasoning_tokens)  # fmt: skip
        if cut:
            return self.response("incomplete", usage=usage,
                                 incomplete_details={"reason": "max_output_tokens"})  # fmt: skip
        if self.cancelled:
            return self.response("cancelled", usage=usage)
        return self.response("completed", usage=usage, completed_at=int(time.time()))

    def messages(self) -> list[dict[str, Any]]:
        """The output as the chat message a later turn's template renders (the reasoning
        left out, as templates drop earlier turns' thinking)."""
        content = "".join(
            part["text"] for i in self.items if i["type"] == "message" for part in i["content"]
        )
        calls = [
            {"id": i["call_id"], "type": "function",
             "function": {"name": i["name"], "arguments": i["arguments"]}}
            for i in self.items if i["type"] == "function_call"
        ]  # fmt: skip
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = calls
        return [message]

    # --- the events ---------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> str:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(event)

    def start(self) -> list[str]:
        in_progress = self.response("in_progress")
        return [self._event("response.created", response=in_progress),
                self._event("response.in_progress", response=in_progress)]  # fmt: skip

    def on_chunk(self, chunk: Chunk) -> list[str]:
        self.last = chunk
        last = chunk.finished is not None
        pieces: OutputPieces = self.output.feed(chunk.text, last, chunk.token_ids)
        if pieces.reasoning and not pieces.content and not pieces.tool_calls:
            self.reasoning_tokens += len(chunk.token_ids)
        calls = [c for c in pieces.tool_calls if self.parallel or c.index == 0]
        # a call open before this chunk gets its argument text first: text after it in the
        # same chunk closes it; calls that start in this chunk come after the text before them
        going_on = [c for c in calls if c.name is None and c.index in self._calls]
        events: list[str] = []
        for call in going_on:
            events += self._call(call.index, None, None, call.arguments)
        if pieces.reasoning:
            events += self._text("reasoning", pieces.reasoning)
        if pieces.content:
            events += self._text("message", pieces.content)
        for call in calls:
            if call not in going_on:
                events += self._call(call.index, call.id, call.name, call.arguments)
        if last:
            if not self.items and self._open is None:  # nothing at all: an empty message
                events += self._text("message", "")
            events += self._close()
        return events

    def end(self) -> tuple[str, dict[str, Any]]:
        """The last event, and the finished response it carries (what is stored)."""
        body = self.final()
        kind = {"incomplete": "response.incomplete", "cancelled": "response.failed"}.get(
            body["status"], "response.completed"
        )  # OpenAI's stream has no cancelled event: a cancelled one ends as failed
        return self._event(kind, response=body), body

    def failed(self, error: ProtocolError) -> str:
        """The response ends with an error: the items so far, closed, then response.failed."""
        events = self._close()
        return "".join(events) + self._event("response.failed", response=self.failed_response(error))

    def failed_response(self, error: ProtocolError) -> dict[str, Any]:
        # OpenAI's codes for a failed response are few; an engine fault, a timeout and an
        # abort are all its "server_error" (the message says which)
        return self.response("failed", error={"code": "server_error", "message": error.message})

    # --- items --------------------------------------------------------------------------------
    def _text(self, kind: str, text: str) -> list[str]:
        events = []
        if self._open is None or self._open.item["type"] != kind:
            events += self._close()
            events += self._open_item(self._text_item(kind))
        item = self._open
        assert item is not None
        if text:
            item.text += text
            delta = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
            extra = {"logprobs": []} if kind == "message" else {}
            events.append(self._event(delta, item_id=item.item["id"], output_index=item.index,
                                      content_index=0, delta=text, **extra))  # fmt: skip
        return events

    def _text_item(self, kind: str) -> dict[str, Any]:
        if kind == "message":
            return {"id": new_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
        return {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [],
                "status": "in_progress"}  # fmt: skip

    def _call(self, index: int, call_id: str | None, name: str | None, arguments: str) -> list[str]:
        events = []
        if name is not None:  # a new call
            events += self._close()
            item = {"id": new_id("fc"), "type": "function_call", "call_id": call_id,
                    "name": name, "arguments": "", "status": "in_progress"}  # fmt: skip
            events += self._open_item(item)
            assert self._open is not None
            self._calls[index] = self._open
        open_call = self._calls.get(index)
        if open_call is not None and arguments:
            open_call.text += arguments
            events.append(self._event("response.function_call_arguments.delta",
                                      item_id=open_call.item["id"], output_index=open_call.index,
                                      delta=arguments))  # fmt: skip
        return events

    def _open_item(self, item: dict[str, Any]) -> list[str]:
        self._open = _OpenItem(len(self.items), item)
        self.items.append(item)  # in progress; replaced by its final form when it closes
        events = [self._event("response.output_item.added", output_index=self._open.index, item=item)]
        part = self._part(item["type"], "")
        if part is not None:
            events.append(self._event("response.content_part.added", item_id=item["id"],
                                      output_index=self._open.index, content_index=0, part=part))  # fmt: skip
        return events

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any] | None:
        if kind == "message":
            return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return None

    def _close(self) -> list[str]:
        item = self._open
        if item is None:
            return []
        self._open = None
        kind = item.item["type"]
        cut = self.last is not None and self.last.finished is not None and (
            self.last.finished.kind == "length"
        )
        done = dict(item.item, status="incomplete" if cut and kind == "message" else "completed")
        events = []
        part = self._part(kind, item.text)
        if part is not None:
            done["content"] = [part]
            ids = {"item_id": done["id"], "output_index": item.index, "content_index": 0}
            if kind == "message":
                events.append(self._event("response.output_text.done", text=item.text, logprobs=[], **ids))
            else:
                events.append(self._event("response.reasoning_text.done", text=item.text, **ids))
            events.append(self._event("response.content_part.done", part=part, **ids))
        else:
            done["arguments"] = item.text
            events.append(self._event("response.function_call_arguments.done", item_id=done["id"],
                                      output_index=item.index, name=done["name"],
                                      arguments=item.text))  # fmt: skip
        self.items[item.index] = done
        events.append(self._event("response.output_item.done", output_index=item.index, item=done))
        return events
