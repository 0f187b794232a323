"""Routing of a mixture-of-experts layer, shared by every way of running the experts
(`model.moe`, `model.triton_moe`): the softmax top-k router and the (token, choice) pairs
sorted by expert."""

from __future__ import annotations

import torch


def route(logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 weights `[tokens, top_k]` and expert ids `[tokens, top_k]` of each token."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def expert_counts(flat_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Pairs per expert; a scatter-add, not `bincount` (which reads the max on the host on
    CUDA and so cannot be captured in a graph)."""
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat_ids.device)
    return counts.scatter_add_(0, flat_ids, torch.ones_like(flat_ids))


class ExpertOrder:
    """The (token, choice) pairs of a batch sorted by expert: `rows[i]` is the token of sorted
    pair i, `weights[i]` its routing weight, `offsets[e]` the end of expert e's pairs."""

    def __init__(self, weights: torch.Tensor, ids: torch.Tensor, num_experts: int) -> None:
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        self.rows = order // ids.shape[1]
        self.experts = flat[order]  # the expert of each sorted pair
        self.weights = weights.reshape(-1)[order]
        self.counts = expert_counts(flat, num_experts)
        self.offsets = torch.cumsum(self.counts, 0).to(torch.int32)

    def active(self) -> list[tuple[int, int, int]]:
        """`(expert, start, end)` of each expert that received pairs (one host sync)."""
        ends = self.offsets.tolist()
        starts = [0, *ends[:-1]]
        return [(e, s, t) for e, (s, t) in enumerate(zip(starts, ends, strict=True)) if t > s]

    def combine(self, out_rows: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Weight each pair's output and add the pairs of each token."""
        weighted = out_rows * self.weights.to(out_rows.dtype).unsqueeze(1)
        out = out_rows.new_zeros(num_tokens, out_rows.shape[1])
        return out.index_add_(0, self.rows, weighted)
