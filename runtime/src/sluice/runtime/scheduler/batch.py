"""`ScheduledBatch`: the requests chosen for one tick, and the `ForwardInput` built from it.

A batch is the decode rows (one token each) followed by the prefill rows (a prompt, or a
chunk of one), in one forward. Building the `ForwardInput` is the only place that decides
what the device's table rows still lack (`KVCacheManager.table_write`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.runtime.engine.forward_input import ForwardInput, RowInput, SamplingInput, VocabMask
from sluice.runtime.forward import ForwardMode
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeRows
from sluice.runtime.scheduler.prefill import PrefillBatch
from sluice.runtime.scheduler.request import Req


@dataclass(frozen=True)
class ScheduledBatch:
    """Request i computes positions [starts[i], starts[i] + lens[i]); the first
    `num_decode` rows are decodes; `sample[i]` is False for an intermediate chunk."""

    reqs: list[Req]
    starts: list[int]
    lens: list[int]
    sample: list[bool]
    num_decode: int

    @property
    def mode(self) -> ForwardMode:
        return ForwardMode.DECODE if self.num_decode == len(self.reqs) else ForwardMode.EXTEND

    @property
    def num_tokens(self) -> int:
        return sum(self.lens)

    @property
    def prefill_reqs(self) -> list[Req]:
        return self.reqs[self.num_decode :]


def batch_of(
    decode: DecodeRows | None, prefill: PrefillBatch | None, cache: KVCacheManager
) -> ScheduledBatch | None:
    """This tick's decode rows, then its prefill rows (None when there is neither)."""
    reqs = list(decode.reqs) if decode is not None else []
    n = len(reqs)
    starts = [cache.kv_len(r) - 1 for r in reqs]
    lens = [1] * n
    sample = [True] * n
    if prefill is not None:
        reqs += prefill.reqs
        starts += prefill.starts
        lens += prefill.lens
        sample += [
            done and r.sampling.max_new_tokens > 0
            for r, done in zip(prefill.reqs, prefill.complete, strict=True)
        ]
    return ScheduledBatch(reqs, starts, lens, sample, n) if reqs else None


def forward_input(
    batch: ScheduledBatch,
    cache: KVCacheManager,
    eos_token_ids: frozenset[int],
    in_flight: Callable[[Req], int],
    vocab_mask: VocabMask | None = None,
) -> ForwardInput:
    """The forward for `batch`; records on each request what its table rows will hold."""
    rows: list[RowInput] = []
    sampling: list[SamplingInput] = []
    for req, start, length, sample in zip(
        batch.reqs, batch.starts, batch.lens, batch.sample, strict=True
    ):
        end = start + length
        row, slot_start, token_start = cache.table_write(req, end, sample)
        logprob_start, targets = _prompt_logprob_targets(req, start, end)
        rows.append(
            RowInput(
                row=row,
                start=start,
                length=length,
                slot_start=slot_start,
                slots=cache.slots(req, slot_start, end),
                token_start=token_start,
                tokens=req.tokens(token_start, end),
                sample=sample,
                logprob_start=logprob_start,
                logprob_targets=targets,
                lora=req.sampling.lora_id,
                window_slots=cache.window_slots(req, slot_start, end),
            )
        )
        if sample:
            sampling.append(_sampling_input(req, eos_token_ids, in_flight(req)))
    return ForwardInput(rows, sampling, vocab_mask)


def _prompt_logprob_targets(req: Req, start: int, end: int) -> tuple[int, list[int]]:
    """Positions of [start, end) whose logits give a still wanted prompt logprob (that of
    the token after each), as (first position, those next tokens)."""
    wanted = req.prompt_logprob_from
    if wanted is None:
        return 0, []
    first = max(start, wanted - 1)
    last = min(end, len(req.input_ids) - 1)  # the last prompt token predicts an output
    if first >= last:
        return 0, []
    return first, req.input_ids[first + 1 : last + 1]


def _sampling_input(req: Req, eos_token_ids: frozenset[int], in_flight: int) -> SamplingInput:
    sp = req.sampling
    banned: tuple[int, ...] = ()
    if len(req.output_ids) + in_flight < sp.min_new_tokens:
        stops = set(sp.stop_token_ids) | (set() if sp.ignore_eos else set(eos_token_ids))
        banned = tuple(sorted(stops))
    return SamplingInput(sp, len(req.input_ids), req.generator, banned)
