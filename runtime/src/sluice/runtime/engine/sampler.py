"""Turning a batch of logits into next tokens, one request's parameters per row, batched.

Order, as transformers' logits processors and OpenAI define them: tokens banned by
`min_tokens` are masked; then the repetition penalty (on prompt and output tokens), the
frequency and presence penalties (on output tokens: `logit -= count * frequency +
(count > 0) * presence`); greedy rows take the argmax; the other rows apply temperature,
top-k, top-p and min-p (each masking logits to -inf as transformers' warpers do) and draw
from the softmax by inverse CDF with one uniform number per row.

Nothing here waits for the device (tests/engine/test_step_syncs.py counts it): the per-row
parameters arrive as device tensors of one staged upload (`SamplingTensors`, packed by
`stage_sampling` into the step's pinned buffer, `memory/staging.py`); every step runs over
all rows with neutral values for the rows a step does not apply to (temperature 1, top-k
off, top-p 1, min-p 0, penalties 1/0/0: each leaves such a row's distribution exactly as it
was), and greedy rows are chosen with `torch.where`, so no row subset is ever indexed with
a host list. The uniform of a row is drawn on the device from the request's seed and the
position of the token (`device_uniforms`, a counter-based hash), so a seeded request gets
the same tokens whatever else shares its batch, in either loop, after a retraction too.

The token history the penalties need is read from the device's token table
(`TokenHistory`), which already holds a token still in flight in the overlap loop. Logprobs
are of the raw distribution (before penalties and temperature).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from sluice.runtime.engine.forward_input import SamplingInput
from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.memory.staging import Staged, Staging

_M32 = 0xFFFFFFFF
_SEED_MOD = 2**63  # seeds are kept as non-negative int64


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


def row_seed(row: SamplingInput) -> int:
    """The seed of a row's draws: its generator's (the request's seed), as int64."""
    return row.generator.initial_seed() % _SEED_MOD if row.generator is not None else 0


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters on the logits' device (`[B]` each), and what the host
    knows about the batch as a whole (which steps any row needs)."""

    temperature: torch.Tensor  # float32; 1 for greedy rows (their draw is discarded)
    top_k: torch.Tensor  # int64; 0: off
    top_p: torch.Tensor  # float32; 1: off
    min_p: torch.Tensor  # float32; 0: off
    repetition: torch.Tensor  # float32; 1: off
    frequency: torch.Tensor  # float32
    presence: torch.Tensor  # float32
    prompt_len: torch.Tensor  # int64
    greedy: torch.Tensor  # int64 0/1
    seed: torch.Tensor  # int64
    counter: torch.Tensor  # int64: the position of the token drawn (with the seed: the uniform)
    banned_rows: torch.Tensor  # int64 [n]: (row, token) pairs masked to -inf
    banned_ids: torch.Tensor  # int64 [n]
    widest_top_k: int  # 0: no row limits top-k
    any_random: bool
    any_top_p: bool
    any_min_p: bool
    any_penalty: bool
    any_banned: bool

    @classmethod
    def of(cls, staged: Staged, rows: Sequence[SamplingInput], vocab: int) -> SamplingTensors:
        params = [r.params for r in rows]
        top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
        return cls(
            *(staged[f"sample.{name}"] for name in _STAGED),
            widest_top_k=max(top_k, default=0),
            any_random=any(not p.is_greedy for p in params),
            any_top_p=any(p.top_p < 1.0 for p in params),
            any_min_p=any(p.min_p > 0.0 for p in params),
            any_penalty=any(needs_penalty(p) for p in params),
            any_banned=any(r.banned_ids for r in rows),
        )


_STAGED = (
    "temperature", "top_k", "top_p", "min_p", "repetition", "frequency", "presence",
    "prompt_len", "greedy", "seed", "counter", "banned_rows", "banned_ids",
)  # fmt: skip
_FLOATS = {"temperature", "top_p", "min_p", "repetition", "frequency", "presence"}


def stage_sampling(
    stage: Staging, rows: Sequence[SamplingInput], vocab: int, positions: Sequence[int] | None = None
) -> None:
    """Add the rows' parameters to a step's staging (`SamplingTensors.of` reads them back);
    `positions`: where each row's token goes (the draw counter; 0s when not given)."""
    params = [r.params for r in rows]
    values: dict[str, list[int] | list[float]] = {
        "temperature": [1.0 if p.is_greedy else max(p.temperature, 1e-5) for p in params],
        "top_k": [p.top_k if 0 < p.top_k < vocab else 0 for p in params],
        "top_p": [p.top_p for p in params],
        "min_p": [p.min_p for p in params],
        "repetition": [p.repetition_penalty for p in params],
        "frequency": [p.frequency_penalty for p in params],
        "presence": [p.presence_penalty for p in params],
        "prompt_len": [r.prompt_len for r in rows],
        "greedy": [int(p.is_greedy) for p in params],
        "seed": [row_seed(r) for r in rows],
        "counter": list(positions) if positions is not None else [0] * len(rows),
        "banned_rows": [i for i, r in enumerate(rows) for _ in r.banned_ids],
        "banned_ids": [t for r in rows for t in r.banned_ids],
    }
    for name in _STAGED:
        dtype = torch.float32 if name in _FLOATS else torch.int64
        stage.add(f"sample.{name}", values[name], dtype)


def sampling_tensors(
    rows: Sequence[SamplingInput], device: torch.device | str, vocab: int,
    positions: Sequence[int] | None = None,
) -> SamplingTensors:  # fmt: skip
    """The rows' `SamplingTensors` in an upload of their own (tests, callers without a step)."""
    stage = Staging()
    stage_sampling(stage, rows, vocab, positions)
    return SamplingTensors.of(stage.upload(device), rows, vocab)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (int64 tensors holding values below 2**32; no overflow)."""
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    x = (((x >> 16) ^ x) * 0x45D9F3B) & _M32
    return (x >> 16) ^ x


def device_uniforms(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One uniform number in (0, 1) per row, float32, a pure function of (seed, counter),
    computed on their device (int64 tensors; seeds non-negative)."""
    lo, hi = seed & _M32, (seed >> 32) & _M32
    h = _mix32((counter & _M32) ^ 0x9E3779B9)
    h = _mix32(h ^ hi)
    h = _mix32(h ^ lo ^ 0x85EBCA6B)
    h = _mix32(h ^ ((counter >> 32) & _M32))
    return ((h >> 8).to(torch.float32) + 0.5) / float(2**24)


def apply_penalties(
    logits: torch.Tensor,
    rows: Sequence[SamplingInput],
    history: TokenHistory,
    tensors: SamplingTensors | None = None,
) -> torch.Tensor:
    """Penalised copy of `logits` `[B, V]` (vLLM's and SGLang's definitions); rows without
    penalties come back unchanged."""
    vocab = logits.shape[-1]
    t = tensors if tensors is not None else sampling_tensors(rows, logits.device, vocab)
    ids = history.ids.to(torch.int64).clamp(0, vocab - 1)
    pos = torch.arange(ids.shape[1], device=ids.device)[None, :]
    known = pos < history.lengths.to(ids.device)[:, None]
    output = known & (pos >= t.prompt_len[:, None])
    counts = torch.zeros_like(logits).scatter_add_(1, ids, output.to(logits.dtype))
    seen = torch.zeros_like(logits).scatter_add_(1, ids, known.to(logits.dtype)) > 0
    rep = t.repetition[:, None].to(logits.dtype)
    penalised = torch.where(logits > 0, logits / rep, logits * rep)
    out = torch.where(seen, penalised, logits)
    freq, pres = t.frequency[:, None].to(logits.dtype), t.presence[:, None].to(logits.dtype)
    return out - freq * counts - pres * (counts > 0).to(logits.dtype)


def warp(
    logits: torch.Tensor, params: Sequence[SamplingParams], tensors: SamplingTensors | None = None
) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p on `logits` `[B, V]`, as transformers' warpers:
    dropped tokens become -inf; the softmax of the result is the sampling distribution."""
    vocab = logits.shape[-1]
    if tensors is None:
        rows = [SamplingInput(p, 0, None) for p in params]
        tensors = sampling_tensors(rows, logits.device, vocab)
    t = tensors
    x = logits / t.temperature[:, None].to(logits.dtype)
    if t.widest_top_k:
        kth = torch.topk(x, t.widest_top_k, dim=-1).values
        index = (t.top_k - 1).clamp(0, t.widest_top_k - 1)[:, None]
        threshold = kth.gather(1, index)
        x = x.masked_fill((t.top_k > 0)[:, None] & (x < threshold), float("-inf"))
    if t.any_top_p:
        ascending, order = torch.sort(x, dim=-1)
        cum = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= 1 - t.top_p[:, None].to(x.dtype)
        drop[:, -1] = False  # keep at least the most likely token
        drop &= (t.top_p < 1.0)[:, None]  # rows without top-p keep every token
        x = x.masked_fill(torch.zeros_like(drop).scatter(1, order, drop), float("-inf"))
    if t.any_min_p:
        probs = x.softmax(dim=-1)
        floor = t.min_p[:, None].to(x.dtype) * probs.amax(dim=-1, keepdim=True)
        x = x.masked_fill(probs < floor, float("-inf"))
    return x


def draw(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of `probs` by inverse CDF of the row's uniform `u` (`[B]`)."""
    cum = probs.cumsum(dim=-1)
    target = (u.to(cum.dtype) * cum[:, -1])[:, None]
    picked = torch.searchsorted(cum, target, right=True)[:, 0]
    return picked.clamp(max=probs.shape[-1] - 1)


def sample(
    logits: torch.Tensor,
    rows: Sequence[SamplingInput],
    history: TokenHistory | None = None,
    vocab_mask: torch.Tensor | None = None,
    tensors: SamplingTensors | None = None,
) -> SampleOutput:
    """Next token for every row of `logits` (`[len(rows), vocab]`); `vocab_mask` is a token
    bitmask over the rows (constrained decoding), applied after the penalties; `tensors`:
    the rows' parameters already on the device (else uploaded here)."""
    logits = logits.float()
    vocab = logits.shape[-1]
    t = tensors if tensors is not None else sampling_tensors(rows, logits.device, vocab)
    top_k = max((r.params.top_logprobs_num for r in rows), default=0)
    wants_logprobs = top_k > 0 or any(r.params.logprobs for r in rows)
    raw = torch.log_softmax(logits, dim=-1) if wants_logprobs else None
    x = logits
    if t.any_banned:
        x = x.index_put((t.banned_rows, t.banned_ids), x.new_full((), float("-inf")))
    if t.any_penalty:
        if history is None:
            raise ValueError("penalties need the token history")
        x = apply_penalties(x, rows, history, t)
    if vocab_mask is not None:
        from sluice.runtime.constrained import apply_token_bitmask

        x = x.clone() if x is logits else x
        apply_token_bitmask(x, vocab_mask)  # every row: the mask is over the sampled rows
    tokens = torch.argmax(x, dim=-1)
    if t.any_random:
        probs = warp(x, [r.params for r in rows], t).softmax(dim=-1)
        drawn = draw(probs, device_uniforms(t.seed, t.counter))
        tokens = torch.where(t.greedy.bool(), tokens, drawn)
    if raw is None:
        return SampleOutput(tokens, None)
    logprobs = raw.gather(1, tokens[:, None])[:, 0]
    if top_k == 0:
        return SampleOutput(tokens, logprobs)
    best = raw.topk(top_k, dim=-1)
    return SampleOutput(tokens, logprobs, best.indices, best.values)
