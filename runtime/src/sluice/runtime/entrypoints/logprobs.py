"""Logprobs in OpenAI's and SGLang's response shapes, from per-position token logprobs.

Pure functions over `PositionLogprobs` (the chosen token, its logprob, and the top-k
alternatives the sampler returned, best first). Each token is shown by its own bytes
(`TokenBytes`, from xgrammar's decoded vocabulary: byte-level BPE, byte-fallback `<0xE2>`
tokens and SentencePiece `▁` handled): a token whose bytes are valid UTF-8 is that text;
one that holds part of a character (a UTF-8 sequence split across tokens) is shown as
`bytes:` and its bytes with `\\xNN` escapes, and its `bytes` field has them exactly, so
the bytes of the tokens concatenated are the bytes of the output. With
`return_tokens_as_token_ids` (vLLM) a token is shown as `token_id:<id>`.

Completions' `text_offset` counts the complete characters of the tokens before; a
character split across tokens is counted once it is complete.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.entrypoints.openai_responses import (
    ChatLogprobs,
    ChatLogprobToken,
    CompletionLogprobs,
    TopLogprob,
)


@dataclass(frozen=True)
class PositionLogprobs:
    """One output (or prompt) position: the token there and the best alternatives."""

    token_id: int
    logprob: float | None  # None: no logprob (the first prompt token)
    top: Sequence[tuple[int, float]] = ()  # (token id, logprob), best first


@dataclass
class TokenBytes:
    """Token id -> its own bytes, for one tokenizer (built once per server)."""

    table: Sequence[bytes]
    as_ids: bool = False  # vLLM's return_tokens_as_token_ids
    cache: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBytes:
        import xgrammar as xgr

        return cls(xgr.TokenizerInfo.from_huggingface(tokenizer).decoded_vocab)

    def with_ids(self, as_ids: bool) -> TokenBytes:
        return self if as_ids == self.as_ids else TokenBytes(self.table, as_ids)

    def bytes_of(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""

    def text_of(self, token_id: int) -> str:
        if self.as_ids:
            return f"token_id:{token_id}"
        text = self.cache.get(token_id)
        if text is None:
            raw = self.bytes_of(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + raw.decode("utf-8", "backslashreplace")
            self.cache[token_id] = text
        return text


def chat_logprobs(tb: TokenBytes, positions: Sequence[PositionLogprobs], k: int) -> ChatLogprobs:
    """`choices[].logprobs` of a chat completion: `content[]` with `top_logprobs` (k best)."""
    content = []
    for p in positions:
        tops = [
            TopLogprob(token=tb.text_of(t), logprob=lp, bytes=list(tb.bytes_of(t)))
            for t, lp in p.top[:k]
        ]
        content.append(
            ChatLogprobToken(
                token=tb.text_of(p.token_id),
                logprob=p.logprob if p.logprob is not None else float("-inf"),
                bytes=list(tb.bytes_of(p.token_id)),
                top_logprobs=tops,
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(
    tb: TokenBytes, positions: Sequence[PositionLogprobs], k: int, offset: int
) -> CompletionLogprobs:
    """`choices[].logprobs` of a completion: tokens, token_logprobs, top_logprobs (the
    chosen token plus the k best, as vLLM returns them), text_offset from `offset`."""
    tokens, offsets, tops = [], [], []
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # holds split characters
    for p in positions:
        tokens.append(tb.text_of(p.token_id))
        offsets.append(offset)
        offset += len(utf8.decode(tb.bytes_of(p.token_id)))
        best = {tb.text_of(t): lp for t, lp in p.top[:k]}
        best.setdefault(tb.text_of(p.token_id), p.logprob if p.logprob is not None else 0.0)
        tops.append(best)
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[p.logprob for p in positions],
        top_logprobs=tops,
        text_offset=offsets,
    )


def generate_logprobs(
    tb: TokenBytes, positions: Sequence[PositionLogprobs], k: int, with_text: bool
) -> tuple[list[list[Any]], list[list[list[Any]]] | None]:
    """SGLang's `*_token_logprobs` (`[logprob, id]` or `[logprob, id, text]`) and, when
    k > 0, `*_top_logprobs` (per position, k of those triples)."""

    def entry(lp: float | None, t: int) -> list[Any]:
        return [lp, t, tb.text_of(t)] if with_text else [lp, t]

    chosen = [entry(p.logprob, p.token_id) for p in positions]
    if k <= 0:
        return chosen, None
    return chosen, [[entry(lp, t) for t, lp in p.top[:k]] for p in positions]
