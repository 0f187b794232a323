"""OpenAI response bodies (and SGLang's /generate body) and the pure functions that build
them from the TokenizerManager's chunks."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from sluice.runtime.ipc.messages import FinishReason


def _without_none(handler: SerializerFunctionWrapHandler, obj: Any) -> dict[str, Any]:
    return {k: v for k, v in handler(obj).items() if v is not None}


# --- responses ------------------------------------------------------------------------------
class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> Usage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids
    prompt_token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _drop_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        for key in ("token_ids", "prompt_token_ids"):
            if out.get(key) is None:
                out.pop(key, None)
        return out


class CompletionResponse(BaseModel):
    """Both the whole response and each streamed chunk (same shape, as in OpenAI)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None  # with --reasoning-parser
    tool_calls: list[ToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_empty_calls(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if not out.get("tool_calls"):
            out.pop("tool_calls", None)
        if out.get("reasoning_content") is None:
            out.pop("reasoning_content", None)
        return out


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # vLLM's return_token_ids

    @model_serializer(mode="wrap")
    def _drop_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("token_ids") is None:
            out.pop("token_ids", None)
        return out


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    def _drop_ids(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out = handler(self)
        if out.get("prompt_token_ids") is None:
            out.pop("prompt_token_ids", None)
        return out


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler, self)


class DeltaToolCall(BaseModel):
    """A streamed tool call piece: the first has id, type and name; later ones only
    argument text (OpenAI's shape)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler, self)


class DeltaMessage(BaseModel):
    """A streamed message piece; unset fields are left out (`{}` in the final chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None  # with --reasoning-parser
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_none(handler, self)


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sluice"
    root: str | None = None
    parent: str | None = None  # a LoRA adapter's base model (vLLM)
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- response builders ------------------------------------------------------------------------
def usage_of(finals: list[Any], n: int = 1) -> Usage:
    """Usage from each choice's last chunk (or one chunk's counts so far), prompt-major with
    `n` choices per prompt: each prompt counted once (its n choices share it, as OpenAI
    counts them), completion tokens summed."""
    prompts = finals[::n]
    completion = sum(c.completion_tokens for c in finals)
    return Usage.of(
        sum(c.prompt_tokens for c in prompts), completion, sum(c.cached_tokens for c in prompts)
    )


def generate_body(
    rid: str, text: str, ids: list[int], logprobs: dict[str, Any] | None, last: Any
) -> dict[str, Any]:
    """/generate's response (SGLang's shape) from the text and ids so far and the latest
    chunk; `logprobs`: the meta_info logprob entries (None leaves them out)."""
    reason: FinishReason | None = last.finished
    finish: dict[str, Any] | None = None
    if reason is not None:
        finish = {"type": reason.kind}
        if reason.kind == "stop":
            finish["matched"] = (
                reason.matched_str if reason.matched_str is not None else reason.matched_token
            )
        elif reason.kind == "length":
            finish["length"] = last.completion_tokens
        elif reason.message:
            finish["message"] = reason.message
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": last.prompt_tokens,
        "completion_tokens": last.completion_tokens,
        "cached_tokens": last.cached_tokens,
    }
    if logprobs is not None:
        meta.update(logprobs)
    return {"text": text, "output_ids": list(ids), "meta_info": meta}
