"""OpenAI response bodies (and SGLang's /generate body) and the pure functions that build
them from the TokenizerManager's chunks."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

from sluice.runtime.entrypoints.openai_protocol import stop_reason
from sluice.runtime.ipc.messages import FinishReason


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


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class DeltaMessage(BaseModel):
    """A streamed message piece; unset fields are left out (`{}` in the final chunk)."""

    role: Literal["assistant"] | None = None
    content: str | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}


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
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# --- response builders ------------------------------------------------------------------------
def usage_of(finals: list[Any]) -> Usage:
    """Usage from each choice's last chunk: the prompt counted once (as OpenAI does for
    n > 1), completion tokens summed."""
    first = finals[0]
    completion = sum(c.completion_tokens for c in finals)
    return Usage.of(first.prompt_tokens, completion, first.cached_tokens)


def completion_logprobs(
    tokens: list[str], logprobs: list[float], top: int, offset: int
) -> CompletionLogprobs:
    """Completions' logprobs for the chosen tokens; `offset`: where the first one starts."""
    offsets = []
    for tok in tokens:
        offsets.append(offset)
        offset += len(tok)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=list(logprobs),
        top_logprobs=[{t: lp} for t, lp in zip(tokens, logprobs, strict=False)] if top else None,
        text_offset=offsets,
    )


def chat_logprobs(tokens: list[str], logprobs: list[float], top: int) -> ChatLogprobs:
    content = []
    for tok, lp in zip(tokens, logprobs, strict=False):
        entry = TopLogprob(token=tok, logprob=lp, bytes=list(tok.encode()))
        content.append(ChatLogprobToken(**entry.model_dump(), top_logprobs=[entry] if top else []))
    return ChatLogprobs(content=content)


def generate_body(
    rid: str, text: str, ids: list[int], logprobs: list[float] | None, last: Any
) -> dict[str, Any]:
    """/generate's response (SGLang's shape) from the text and ids so far and the latest
    chunk; `logprobs` None leaves them out."""
    reason: FinishReason | None = last.finished
    finish: dict[str, Any] | None = None
    if reason is not None:
        finish = {"type": reason.kind}
        if reason.kind == "stop":
            finish["matched"] = stop_reason(reason)
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
        meta["output_token_logprobs"] = [[lp, t] for lp, t in zip(logprobs, ids, strict=False)]
    return {"text": text, "output_ids": list(ids), "meta_info": meta}
