"""`Req`: one generation request inside the scheduler: what it is, what it asked for and
what it has produced.

A request has no state field: where it is (waiting, being chunked, decoding, finished but
still used by an in-flight forward) is decided by which manager holds it, and only that
manager moves it (see `scheduler.py`); what KV pages and table row it holds is the
`KVCacheManager`'s (`cache.KVHolding`, by request id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from sluice.runtime.ipc.messages import DisaggHandoff, FinishReason, SamplingParams

# A request's own max_new_tokens counts at most this much in every KV estimate (admission,
# the running reservation, the new-token ratio), so one request asking for a huge output
# cannot block the pool (SGLang clips the same way).
CLIP_MAX_NEW_TOKENS = 4096


@dataclass(eq=False)
class Req:
    """A request: its prompt and sampling parameters, its output so far, how it ended.
    A retracted request keeps its output and re-prefills exactly what it had."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = 0.0
    eos_token_ids: frozenset[int] = frozenset()
    generator: torch.Generator | None = None
    handoff: DisaggHandoff | None = None  # a P/D request's transfer (`scheduler/disagg.py`)
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    # per output token, the raw distribution's best (ids, logprobs) when top_logprobs_num > 0
    output_top_logprobs: list[tuple[list[int], list[float]]] = field(default_factory=list)
    # prompt logprobs (logprob_start_len >= 0), gathered over the prompt's prefill chunks
    input_logprobs: list[float] = field(default_factory=list)
    matcher: Any = None  # constrained decoding: a GrammarMatcher in step with output_ids
    finish_reason: FinishReason | None = None
    # accounting
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    retractions: int = 0
    enqueued_tick: int = 0  # the prefill pass at which it (re-)entered the waiting queue
    sent_len: int = 0  # output tokens already reported to the detokenizer
    announced: bool = False  # its first update (with how to detokenize it) went out

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        """Token ids of positions [start, end) of the sequence (prompt, then output)."""
        n = len(self.input_ids)
        if end <= n:
            return self.input_ids[start:end]
        if start >= n:
            return self.output_ids[start - n : end - n]
        return self.input_ids[start:] + self.output_ids[: end - n]

    @property
    def fill_ids(self) -> list[int]:
        return self.tokens(0, self.seq_len)

    @property
    def prompt_logprob_from(self) -> int | None:
        """First prompt position whose logprob is still wanted (None: none is)."""
        start = self.sampling.logprob_start_len
        if start < 0 or self.retractions:
            return None
        return max(1, start) + len(self.input_logprobs)

    @property
    def remaining_new_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    @property
    def clipped_remaining_new_tokens(self) -> int:
        """What the KV estimates count of the output still to come."""
        return max(0, min(self.remaining_new_tokens, CLIP_MAX_NEW_TOKENS))

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: FinishReason) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason

    def check_finished_after(self, token: int) -> None:
        """Apply the stop conditions that need only token ids (after `token` was appended)."""
        if self.is_finished:
            return
        n_out = len(self.output_ids)
        if n_out >= self.sampling.min_new_tokens:
            if token in self.sampling.stop_token_ids:
                self.finish(FinishReason("stop", matched_token=token))
                return
            if not self.sampling.ignore_eos and token in self.eos_token_ids:
                self.finish(FinishReason("stop", matched_token=token))
                return
        if n_out >= self.sampling.max_new_tokens:
            self.finish(FinishReason("length"))


# a LoRA adapter's K/V differ from the base model's for the same tokens: its radix keys are
# the token ids offset by (adapter id << 32), so two adapters (or an adapter and the base
# model) never share a page; ids are never reused, so a reloaded adapter starts cold
LORA_KEY_SHIFT = 1 << 32


def cache_key(req: Req, end: int) -> list[int]:
    """The prefix cache's key for positions [0, end) of `req`."""
    tokens = req.tokens(0, end)
    lora = req.sampling.lora_id
    return [t + lora * LORA_KEY_SHIFT for t in tokens] if lora else tokens
