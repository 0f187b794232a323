"""What the scheduler hands the model worker for one forward, and what it gets back.

The worker owns every device tensor: the K/V buffers, the request->KV-slot table and the
token table (row r, position p: the token id at position p of the request in row r). A
`ForwardInput` says, per row, which positions to compute and what the device does not know
yet: the KV slots and token ids to write into the row first. A decode row sends no token:
its input is the token the previous forward sampled into the token table, which may still
be running in the overlap loop. So nothing here knows about overlap.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from sluice.runtime.ipc.messages import SamplingParams


@dataclass(frozen=True)
class RowInput:
    """Row `row` computes positions [start, start + length).

    Before the forward, `slots` are written into the row's KV-slot table at positions
    [slot_start, slot_start + len(slots)) and `tokens` into its token table at
    [token_start, token_start + len(tokens)); together they cover at least the computed
    positions (the rest of the row was written by earlier forwards). With `sample`, the
    next token is sampled and written to the token table at `start + length`.
    """

    row: int
    start: int
    length: int
    slot_start: int
    slots: list[int]
    token_start: int
    tokens: list[int]
    sample: bool
    # prompt logprobs: the logits at positions [logprob_start, + len(logprob_targets)) give
    # the logprob of each target (the token at the next position)
    logprob_start: int = 0
    logprob_targets: list[int] = field(default_factory=list)
    lora: int = 0  # the LoRA adapter's id (0: the base model)
    # with a window pool: the sliding layers' slots of the same positions as `slots`
    window_slots: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class SamplingInput:
    """What the sampler needs of one sampled row (the request's own parameters)."""

    params: SamplingParams
    prompt_len: int  # positions before it are the prompt (penalties count output tokens)
    generator: torch.Generator | None
    banned_ids: tuple[int, ...] = ()  # EOS / stop tokens while min_new_tokens is not reached


@dataclass(frozen=True)
class VocabMask:
    """A token bitmask over the sampled rows (constrained decoding), int32 `[rows, V/32]`,
    or None when no row is constrained after all. The scheduler may still be computing it
    (overlap loop: it needs the previous batch's tokens first); the worker waits for it
    just before sampling, after the model's forward."""

    result: Future[torch.Tensor | None] = field(default_factory=Future)


@dataclass(frozen=True)
class ForwardInput:
    rows: list[RowInput]
    sampling: list[SamplingInput]  # one per row with `sample`, in row order
    vocab_mask: VocabMask | None = None

    @property
    def num_tokens(self) -> int:
        return sum(r.length for r in self.rows)

    @property
    def is_decode(self) -> bool:
        return all(r.length == 1 and not r.tokens for r in self.rows)


@dataclass(frozen=True)
class ForwardOutput:
    """Per row with `sample` (in row order): the token and, when asked, its logprob and the
    raw distribution's best tokens; per row (all rows): its prompt logprobs, if asked."""

    token_ids: list[int]
    logprobs: list[float | None]
    forward_seconds: float = 0.0
    top_logprobs: list[tuple[list[int], list[float]] | None] = field(default_factory=list)
    prompt_logprobs: list[list[float]] = field(default_factory=list)
