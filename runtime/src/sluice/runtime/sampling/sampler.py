"""Turning a batch of logits into next tokens, one request's parameters per row, batched.

Order, as transformers' logits processors and OpenAI define them: tokens banned by
`min_tokens` are masked; then the repetition penalty (on prompt and output tokens), the
frequency and presence penalties (on output tokens: `logit -= count * frequency +
(count > 0) * presence`); greedy rows take the argmax; the other rows apply temperature,
top-k, top-p and min-p (each masking logits to -inf as transformers' warpers do) and draw
from the softmax by inverse CDF with one uniform number from the request's own
`torch.Generator`, so a seeded request gets the same tokens whatever else shares its batch.

Every step is one tensor operation over the rows that need it: no per-row loop on the
device, no host sync but the uniform draws (one number per sampled row). The token history
the penalties need is read from the device's token table (`TokenHistory`), which already
holds a token still in flight in the overlap loop. Logprobs are of the raw distribution
(before penalties and temperature).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sluice.runtime.engine.forward_input import SamplingInput
from sluice.runtime.ipc.messages import SamplingParams


@dataclass(frozen=True)
class TokenHistory:
    """Token ids before the sampled position, per row: `ids[i, :lengths[i]]` (the rest junk)."""

    ids: torch.Tensor  # [B, L] integer
    lengths: torch.Tensor  # [B] int64


@dataclass(frozen=True)
class SampleOutput:
    token_ids: torch.Tensor  # [B] int64, on the logits' device
    logprobs: torch.Tensor | None  # [B] float32 of the raw distribution, when any row asked
    # the raw distribution's k best (k = the largest top_logprobs_num asked), best first
    top_ids: torch.Tensor | None = None  # [B, k] int64
    top_logprobs: torch.Tensor | None = None  # [B, k] float32


def needs_penalty(p: SamplingParams) -> bool:
    return p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0


def needs_history(rows: Sequence[SamplingInput]) -> bool:
    return any(needs_penalty(r.params) for r in rows)


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    return torch.tensor(values, dtype=like.dtype, device=like.device)[:, None]


def apply_penalties(
    logits: torch.Tensor, rows: Sequence[SamplingInput], history: TokenHistory
) -> torch.Tensor:
    """Penalised copy of `logits` `[B, V]` (vLLM's and SGLang's definitions)."""
    vocab = logits.shape[-1]
    ids = history.ids.to(torch.int64).clamp(0, vocab - 1)
    pos = torch.arange(ids.shape[1], device=ids.device)[None, :]
    known = pos < history.lengths.to(ids.device)[:, None]
    prompt_lens = torch.tensor([r.prompt_len for r in rows], device=ids.device)[:, None]
    output = known & (pos >= prompt_lens)
    counts = torch.zeros_like(logits).scatter_add_(1, ids, output.to(logits.dtype))
    seen = torch.zeros_like(logits).scatter_add_(1, ids, known.to(logits.dtype)) > 0
    rep = _column([r.params.repetition_penalty for r in rows], logits)
    freq = _column([r.params.frequency_penalty for r in rows], logits)
    pres = _column([r.params.presence_penalty for r in rows], logits)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    out = torch.where(seen, penalised, logits)
    return out - freq * counts - pres * (counts > 0).to(logits.dtype)


def warp(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p on `logits` `[B, V]`, as transformers' warpers:
    dropped tokens become -inf; the softmax of the result is the sampling distribution."""
    vocab = logits.shape[-1]
    temps = _column([max(p.temperature, 1e-5) for p in params], logits)
    x = logits / temps
    top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(top_k):
        widest = max(top_k)
        kth = torch.topk(x, widest, dim=-1).values
        index = torch.tensor([max(k, 1) - 1 for k in top_k], device=x.device)[:, None]
        threshold = kth.gather(1, index)
        limited = torch.tensor([k > 0 for k in top_k], device=x.device)[:, None]
        x = x.masked_fill(limited & (x < threshold), float("-inf"))
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if rows:
        sub = x[rows]
        ascending, order = torch.sort(sub, dim=-1)
        cum = ascending.softmax(dim=-1).cumsum(dim=-1)
        top_p = _column([params[i].top_p for i in rows], x)
        drop = cum <= 1 - top_p
        drop[:, -1] = False  # keep at least the most likely token
        sub = sub.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
        x[rows] = sub
    rows = [i for i, p in enumerate(params) if p.min_p > 0.0]
    if rows:
        sub = x[rows]
        probs = sub.softmax(dim=-1)
        min_p = _column([params[i].min_p for i in rows], x)
        sub = sub.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
        x[rows] = sub
    return x


def draw(probs: torch.Tensor, generators: Sequence[torch.Generator | None]) -> torch.Tensor:
    """One token per row of `probs` by inverse CDF, each row's uniform from its generator."""
    u = torch.cat([torch.rand(1, generator=g) for g in generators]).to(probs.device)
    cum = probs.cumsum(dim=-1)
    target = (u * cum[:, -1])[:, None]
    picked = torch.searchsorted(cum, target, right=True)[:, 0]
    return picked.clamp(max=probs.shape[-1] - 1)


def sample(
    logits: torch.Tensor,
    rows: Sequence[SamplingInput],
    history: TokenHistory | None = None,
    vocab_mask: torch.Tensor | None = None,
) -> SampleOutput:
    """Next token for every row of `logits` (`[len(rows), vocab]`); `vocab_mask` is a token
    bitmask over the rows (constrained decoding), applied after the penalties."""
    logits = logits.float()
    top_k = max((r.params.top_logprobs_num for r in rows), default=0)
    wants_logprobs = top_k > 0 or any(r.params.logprobs for r in rows)
    raw = torch.log_softmax(logits, dim=-1) if wants_logprobs else None
    x = logits
    banned = [(i, r.banned_ids) for i, r in enumerate(rows) if r.banned_ids]
    if banned:
        x = x.clone()
        for i, ids in banned:
            x[i, list(ids)] = float("-inf")
    penalised = [i for i, r in enumerate(rows) if needs_penalty(r.params)]
    if penalised:
        if history is None:
            raise ValueError("penalties need the token history")
        pick = torch.tensor(penalised, device=x.device)
        part = TokenHistory(history.ids[pick], history.lengths[pick])
        x = x.clone() if x is logits else x
        x[pick] = apply_penalties(x[pick], [rows[i] for i in penalised], part)
    if vocab_mask is not None:
        from sluice.runtime.constrained import apply_token_bitmask

        x = x.clone() if x is logits else x
        apply_token_bitmask(x, vocab_mask, range(len(rows)))
    tokens = torch.argmax(x, dim=-1)
    random_rows = [i for i, r in enumerate(rows) if not r.params.is_greedy]
    if random_rows:
        pick = torch.tensor(random_rows, device=x.device)
        probs = warp(x[pick], [rows[i].params for i in random_rows]).softmax(dim=-1)
        tokens[pick] = draw(probs, [rows[i].generator for i in random_rows])
    if raw is None:
        return SampleOutput(tokens, None)
    logprobs = raw.gather(1, tokens[:, None])[:, 0]
    if top_k == 0:
        return SampleOutput(tokens, logprobs)
    best = raw.topk(top_k, dim=-1)
    return SampleOutput(tokens, logprobs, best.indices, best.values)
