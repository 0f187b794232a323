"""Turning a batch of logits into next tokens, one request's parameters per row.

Greedy rows take the argmax. Other rows apply, in order: penalties (repetition on prompt and
output tokens, frequency and presence on output tokens), temperature, top-k, top-p, min-p,
then draw with the request's own `torch.Generator`, so a seeded request gets the same
tokens whatever else shares its batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.runtime.ipc.messages import SamplingParams


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs of one request."""

    params: SamplingParams
    prompt_ids: list[int]
    output_ids: list[int]
    generator: torch.Generator | None
    banned_ids: tuple[int, ...] = ()  # EOS / stop tokens while min_new_tokens is not reached


@dataclass(frozen=True)
class SampleOutput:
    token_ids: list[int]
    logprobs: list[float | None]


def _needs_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def needs_history(row: SamplingRow) -> bool:
    """Whether sampling this row reads the request's generated tokens."""
    return _needs_penalty(row.params)


def apply_penalties(logits: torch.Tensor, row: SamplingRow) -> torch.Tensor:
    """Penalise one row of logits in place, as vLLM and SGLang define the penalties."""
    p = row.params
    device = logits.device
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(row.prompt_ids) | set(row.output_ids)), device=device)
        if seen.numel():
            vals = logits[seen]
            logits[seen] = torch.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
    if row.output_ids and (p.frequency_penalty != 0.0 or p.presence_penalty != 0.0):
        ids = torch.tensor(row.output_ids, device=device)
        counts = torch.bincount(ids, minlength=logits.shape[-1])[: logits.shape[-1]].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def filter_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p for one row."""
    logits = logits / max(p.temperature, 1e-5)
    vocab = logits.shape[-1]
    if 0 < p.top_k < vocab:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_probs, dim=-1)
        drop = (cum - sorted_probs) > p.top_p  # keep the smallest set reaching top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.max(), 0.0)
    return probs / probs.sum()


def sample(logits: torch.Tensor, rows: list[SamplingRow]) -> SampleOutput:
    """Next token for every row of `logits` (`[len(rows), vocab]`, fp32)."""
    logits = logits.float()
    want_logprobs = any(r.params.logprobs for r in rows)
    raw_logprobs = torch.log_softmax(logits, dim=-1) if want_logprobs else None
    if all(r.params.is_greedy and not r.banned_ids and not _needs_penalty(r.params) for r in rows):
        tokens = torch.argmax(logits, dim=-1).tolist()
    else:
        tokens = []
        for i, row in enumerate(rows):
            x = logits[i].clone()
            if row.banned_ids:
                x[list(row.banned_ids)] = float("-inf")
            if _needs_penalty(row.params):
                apply_penalties(x, row)
            if row.params.is_greedy:
                tokens.append(int(torch.argmax(x)))
                continue
            probs = filter_probs(x, row.params)
            pick = torch.multinomial(probs.cpu(), 1, generator=row.generator)
            tokens.append(int(pick))
    logprobs: list[float | None] = [None] * len(rows)
    if raw_logprobs is not None:
        picked = raw_logprobs[torch.arange(len(rows)), torch.tensor(tokens, device=logits.device)]
        values = picked.tolist()
        logprobs = [v if r.params.logprobs else None for v, r in zip(values, rows, strict=True)]
    return SampleOutput(tokens, logprobs)
