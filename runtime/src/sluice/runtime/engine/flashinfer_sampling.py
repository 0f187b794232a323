"""Batched top-k / top-p / min-p sampling on the GPU with FlashInfer's kernels.

One call samples a whole batch with per-row parameters and no host synchronisation:
temperature, then top-k, then top-p, then min-p (the order of `sampler.filter_probs`),
then a draw. Rows with temperature 0 take the argmax of the raw logits.

Randomness: FlashInfer's kernels draw row `i` from Philox(seed, subsequence i, offset),
with one seed for the launch, so a row's draw depends on its position in the batch.
Unseeded rows are drawn in one launch from `generator` (or torch's default CUDA
generator). A row with its own seed is drawn in a launch of its own, at subsequence 0 with
that seed and its offset: the same request gets the same token whatever else shares its
batch, as the CPU sampler's per-request `torch.Generator` gives. Seeds and offsets are
host tensors, so choosing which rows launch alone needs no device read.

GPU only (`flashinfer-python`); the torch sampler stays the reference and the CPU path.
"""

from __future__ import annotations

import torch

UNSEEDED = -1
# FlashInfer's Philox draws four 32-bit values per step; a row's offset should advance by
# at least this much per sampled token
PHILOX_OFFSET_STEP = 4


def flashinfer_sample(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor,
    *,
    seeds: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids `[B]` (int64, on `logits.device`).

    - `logits` `[B, V]` fp32 on a CUDA device (penalties and banned tokens already applied);
    - `temperature` `[B]` fp32, `<= 0` means greedy;
    - `top_k` `[B]` int32, `<= 0` or `>= V` means off;
    - `top_p` `[B]` fp32 in (0, 1], 1 means off;
    - `min_p` `[B]` fp32 in [0, 1), 0 means off;
    - `seeds` `[B]` int64 on the CPU, `UNSEEDED` (-1) for rows drawn from `generator`;
    - `offsets` `[B]` int64 on the CPU, the Philox offset of each seeded row (advance it by
      `PHILOX_OFFSET_STEP` per token the request has sampled);
    - `generator`: a CUDA `torch.Generator` for the unseeded rows.
    """
    from flashinfer import sampling as fi

    batch, vocab = logits.shape
    device = logits.device
    if seeds is not None and (seeds.device.type != "cpu" or seeds.shape != (batch,)):
        raise ValueError("seeds must be a [batch] int64 tensor on the CPU")
    if offsets is not None and (offsets.device.type != "cpu" or offsets.shape != (batch,)):
        raise ValueError("offsets must be a [batch] int64 tensor on the CPU")
    logits = logits.float()
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    k = top_k.to(device=device, dtype=torch.int32)
    k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
    probs = fi.top_k_renorm_probs(probs, k)
    probs = fi.top_p_renorm_probs(probs, top_p.to(device=device, dtype=torch.float32))
    min_p = min_p.to(device=device, dtype=torch.float32)
    sampled = fi.min_p_sampling_from_probs(probs, min_p, generator=generator).to(torch.int64)
    if seeds is not None:
        rows = (seeds != UNSEEDED).nonzero().flatten().tolist()  # a CPU tensor: no device sync
        for i in rows:
            offset = int(offsets[i]) if offsets is not None else 0
            token = fi.min_p_sampling_from_probs(
                probs[i : i + 1], min_p[i : i + 1], seed=int(seeds[i]), offset=offset
            )
            sampled[i] = token[0].to(torch.int64)
    return torch.where(greedy, torch.argmax(logits, dim=-1), sampled)
