"""The MoE experts on the GPU in Triton: tokens sorted and block-padded by expert.

`align_by_expert` (torch ops only, no host sync) sorts the (token, choice) pairs by expert
and pads each expert's run to a multiple of `BLOCK_M`, so every block of rows belongs to one
expert; blocks past the end get expert -1 and do nothing. Its buffers have the worst-case
size for the batch (pairs + experts x (BLOCK_M - 1)), so the launch grid depends only on
the batch size: the launches can be captured in a CUDA graph and replayed.

`_expert_gemm_kernel` is one launch over all (block, output tile) pairs: a block loads its
rows of the input (a token's hidden state, or a pair's activation), multiplies them by its
expert's weight tile, optionally scales by the routing weight, and writes the pairs' rows.
A layer is two launches (gate/up, then down) with SiLU-and-multiply between them and the
sum over each token's choices after, as vLLM's and SGLang's fused MoE do.

On the CPU the kernel runs under `TRITON_INTERPRET=1` (the tests compare it with the torch
path); `MoE` picks it on CUDA devices when Triton is installed.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from sluice.runtime.model.moe_routing import expert_counts

BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32


class ExpertBlocks(NamedTuple):
    """`sorted_pairs[i]`: the pair in padded row i (`num_pairs`: padding); `block_experts[b]`:
    the expert of rows `[b * BLOCK_M, (b + 1) * BLOCK_M)` (-1: past the end)."""

    sorted_pairs: torch.Tensor
    block_experts: torch.Tensor


def align_by_expert(ids: torch.Tensor, num_experts: int, block_m: int = BLOCK_M) -> ExpertBlocks:
    flat = ids.reshape(-1)
    num_pairs = flat.numel()
    max_rows = num_pairs + num_experts * (block_m - 1)
    max_rows = -(-max_rows // block_m) * block_m
    counts = expert_counts(flat, num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    padded_start = padded_end - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    start = torch.cumsum(counts, 0) - counts  # each expert's first sorted pair
    rank = torch.arange(num_pairs, device=ids.device) - start[sorted_experts]
    rows = padded_start[sorted_experts] + rank
    sorted_pairs = torch.full((max_rows,), num_pairs, dtype=torch.int32, device=ids.device)
    sorted_pairs[rows] = order.to(torch.int32)
    block_starts = torch.arange(0, max_rows, block_m, device=ids.device)
    block_experts = torch.searchsorted(padded_end, block_starts, right=True)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1).to(torch.int32)
    return ExpertBlocks(sorted_pairs, block_experts)


@triton.jit
def _expert_gemm_kernel(
    a_ptr, w_ptr, out_ptr, pair_weights_ptr, sorted_pairs_ptr, block_experts_ptr,
    num_pairs, N, K,
    stride_am, stride_we, stride_wn, stride_wk, stride_om,
    ROWS_PER_A: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    tile_n = tl.program_id(1)
    expert = tl.load(block_experts_ptr + block)
    if expert >= 0:
        offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
        pairs = tl.load(sorted_pairs_ptr + offs_m)
        valid = pairs < num_pairs
        a_rows = pairs // ROWS_PER_A  # the token of a pair (top_k rows per token), or the pair
        offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + offs_k
            a = tl.load(a_ptr + a_rows[:, None].to(tl.int64) * stride_am + ks[None, :],
                        mask=valid[:, None] & (ks[None, :] < K), other=0.0)  # fmt: skip
            w = tl.load(w_base + offs_n[None, :] * stride_wn + ks[:, None] * stride_wk,
                        mask=(offs_n[None, :] < N) & (ks[:, None] < K), other=0.0)  # fmt: skip
            acc += tl.dot(a, w)
        if MUL_WEIGHT:
            weight = tl.load(pair_weights_ptr + pairs, mask=valid, other=0.0)
            acc = acc * weight[:, None]
        out = out_ptr + pairs[:, None].to(tl.int64) * stride_om + offs_n[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n[None, :] < N))


def expert_gemm(
    a: torch.Tensor,
    weights: torch.Tensor,
    blocks: ExpertBlocks,
    num_pairs: int,
    rows_per_a: int,
    pair_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """`out[p] = a[p // rows_per_a] @ weights[expert(p)].T (* pair_weights[p])`, `[pairs, N]`."""
    num_experts, n, k = weights.shape
    out = a.new_empty(num_pairs, n)
    grid = (blocks.block_experts.numel(), triton.cdiv(n, BLOCK_N))
    scale = pair_weights if pair_weights is not None else out  # unused without MUL_WEIGHT
    _expert_gemm_kernel[grid](
        a, weights, out, scale, blocks.sorted_pairs, blocks.block_experts,
        num_pairs, n, k,
        a.stride(0), weights.stride(0), weights.stride(1), weights.stride(2), out.stride(0),
        ROWS_PER_A=rows_per_a, MUL_WEIGHT=pair_weights is not None,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return out


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: object,
) -> torch.Tensor:
    """The experts' output `[tokens, hidden]` for routing `weights`/`ids` `[tokens, top_k]`;
    `act` maps gate_up rows to activations (SiLU-and-multiply)."""
    tokens, top_k = ids.shape
    num_pairs = tokens * top_k
    blocks = align_by_expert(ids, w13.shape[0])
    gate_up = expert_gemm(x.contiguous(), w13, blocks, num_pairs, top_k)
    h = act(gate_up).contiguous()  # type: ignore[operator]
    pair_weights = weights.reshape(-1).to(torch.float32).contiguous()
    out = expert_gemm(h, w2, blocks, num_pairs, 1, pair_weights)
    return out.view(tokens, top_k, -1).sum(dim=1)
