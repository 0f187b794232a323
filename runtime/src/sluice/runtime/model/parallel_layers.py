"""The vocab-parallel embedding and LM head (see `sharding` for the layout).

The row- and column-parallel linear layers are the model's plain `Linear` with their
shard's shape; the all-reduce after each row-parallel one is issued by the decoder layer.
So quantization (which swaps `Linear`s) and the fused CPU ops apply to shards unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sluice.runtime.distributed.group import TensorParallelGroup


def embed(
    ids: torch.Tensor, weight: torch.Tensor, vocab_start: int, group: TensorParallelGroup
) -> torch.Tensor:
    """Embeddings of `ids` from a vocab shard `weight` holding rows from `vocab_start`:
    each rank looks up the ids it holds (zeros for the others) and the sum is all-reduced."""
    if group.size == 1:
        return F.embedding(ids, weight)
    local = ids - vocab_start
    outside = (local < 0) | (local >= weight.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), weight)
    out.masked_fill_(outside[:, None], 0.0)
    return group.all_reduce(out)


def gather_logits(
    local: torch.Tensor, vocab_size: int, group: TensorParallelGroup
) -> torch.Tensor:
    """The full `[rows, vocab_size]` logits on every rank from each rank's vocab shard
    (the padding past `vocab_size` dropped)."""
    if group.size == 1:
        return local
    return group.all_gather_last_dim(local)[..., :vocab_size]
