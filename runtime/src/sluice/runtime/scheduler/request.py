"""`Req`: one generation request inside the scheduler, and its states."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from sluice.runtime.ipc.messages import FinishReason, SamplingParams


class ReqState(enum.Enum):
    WAITING = "waiting"  # in the waiting queue (new, or retracted)
    PREFILLING = "prefilling"  # admitted; its prompt is being prefilled (possibly in chunks)
    RUNNING = "running"  # in the decode set
    FINISHED = "finished"


@dataclass(eq=False)
class Req:
    """A request and the resources it holds.

    `kv_len` tokens of `fill_ids` have their K/V in the pool, laid out on `kv_pages`
    (positions p lives in page `kv_pages[p // page_size]`). `fill_ids` is the prompt plus
    everything generated so far, so a retracted request re-prefills exactly what it had.
    """

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = 0.0
    eos_token_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    state: ReqState = ReqState.WAITING
    req_pool_idx: int | None = None
    kv_pages: list[int] = field(default_factory=list)
    kv_len: int = 0
    shared_pages: int = 0  # leading kv_pages owned by the radix cache (a matched prefix)
    prefix_node: Any = None  # the locked radix node behind those pages
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (first admission)
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None
    retractions: int = 0
    # overlap loop: tokens sampled by a launched forward whose result is not processed yet
    pending_tokens: int = 0
    # tokens already reported to the detokenizer
    sent_len: int = 0

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    @property
    def seq_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def extend_len(self) -> int:
        """Tokens still to prefill before this request can decode."""
        return self.seq_len - self.kv_len

    @property
    def remaining_new_tokens(self) -> int:
        return self.sampling.max_new_tokens - len(self.output_ids)

    @property
    def generated(self) -> int:
        """Tokens generated so far, counting those still in flight (overlap loop)."""
        return len(self.output_ids) + self.pending_tokens

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def can_decode(self) -> bool:
        return not self.is_finished and self.remaining_new_tokens > 0

    def finish(self, reason: FinishReason) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
        self.state = ReqState.FINISHED

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
