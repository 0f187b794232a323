"""SGMV (segmented gather matrix-vector, Punica/S-LoRA) LoRA kernels in Triton.

Two launches per projection piece, over the adapter segments of the batch (runs of tokens
with one adapter; base-model tokens are in no segment and are never touched):

- shrink, one program per (segment, block of BLOCK_M tokens): `h = x @ A[slot].T`, `[T, R]`
  in fp32, looping over the input features in BLOCK_K tiles;
- expand, one program per (segment, token block, block of BLOCK_N outputs):
  `y += scaling[slot] * h @ B[slot].T`, in place on `y` (a column slice of the fused
  projection's output is fine: only its row stride is used).

`R` is the slot buffers' rank (a power of two, at least 16, for `tl.dot`); an adapter of a
lower rank is zero beyond it, which adds exact zeros. Tiles are converted to fp32 and
accumulated in fp32: IEEE dots for fp32 models (no TF32: the kernel matches the torch
path), TF32 dots for bf16 ones.
On the CPU the kernels run under `TRITON_INTERPRET=1` (the tests).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from sluice.runtime.lora.ops import Segments

# Triton's interpreter (the CPU tests) emulates TF32 wrongly; it runs IEEE dots
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK_M = 16
BLOCK_N = 64
BLOCK_K = 64


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, h_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr,
    K, stride_xt, stride_as, stride_ar, stride_ht,
    R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seg = tl.program_id(0)
    block = tl.program_id(1)
    start = tl.load(seg_start_ptr + seg)
    n = tl.load(seg_len_ptr + seg)
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    if block * BLOCK_M >= n:
        return
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n
    rows = (start + offs_m).to(tl.int64)
    offs_r = tl.arange(0, R)
    acc = tl.zeros((BLOCK_M, R), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        x = tl.load(x_ptr + rows[:, None] * stride_xt + offs_k[None, :],
                    mask=mask_m[:, None] & mask_k[None, :], other=0.0)  # fmt: skip
        a = tl.load(a_ptr + slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None],
                    mask=mask_k[:, None], other=0.0)  # fmt: skip
        acc += tl.dot(x.to(tl.float32), a.to(tl.float32), input_precision=PRECISION)
    tl.store(h_ptr + rows[:, None] * stride_ht + offs_r[None, :], acc, mask=mask_m[:, None])


@triton.jit
def _expand_kernel(
    h_ptr, b_ptr, y_ptr, scaling_ptr, seg_start_ptr, seg_len_ptr, seg_slot_ptr,
    N, stride_ht, stride_bs, stride_bn, stride_yt,
    R: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seg = tl.program_id(0)
    block = tl.program_id(1)
    nblock = tl.program_id(2)
    start = tl.load(seg_start_ptr + seg)
    n = tl.load(seg_len_ptr + seg)
    slot = tl.load(seg_slot_ptr + seg).to(tl.int64)
    if block * BLOCK_M >= n:
        return
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n
    rows = (start + offs_m).to(tl.int64)
    offs_r = tl.arange(0, R)
    offs_n = nblock * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    h = tl.load(
        h_ptr + rows[:, None] * stride_ht + offs_r[None, :], mask=mask_m[:, None], other=0.0
    )
    b = tl.load(b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None],
                mask=mask_n[None, :], other=0.0)  # fmt: skip
    delta = tl.dot(h, b.to(tl.float32), input_precision=PRECISION)
    delta = delta * tl.load(scaling_ptr + slot)
    y_ptrs = y_ptr + rows[:, None] * stride_yt + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    y = tl.load(y_ptrs, mask=mask, other=0.0)
    tl.store(y_ptrs, (y.to(tl.float32) + delta).to(y.dtype), mask=mask)


def lora_triton(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: torch.Tensor,
    seg: Segments,
) -> None:
    """Add the LoRA term to `y [T, out]` in place: `a [S, R, in]`, `b [S, out, R]`,
    `scaling [S]` fp32, all on `x`'s device."""
    if not seg.active:
        return
    assert seg.starts_t is not None and seg.lens_t is not None and seg.slots_t is not None
    assert x.stride(1) == 1 and a.stride(2) == 1 and b.stride(2) == 1 and y.stride(1) == 1
    rank = a.shape[1]
    tokens, fan_in = x.shape
    fan_out = y.shape[1]
    precision = "ieee" if x.dtype == torch.float32 or INTERPRETED else "tf32"
    h = torch.empty(tokens, rank, dtype=torch.float32, device=x.device)
    m_blocks = triton.cdiv(seg.max_len, BLOCK_M)
    nseg = len(seg.slots)
    _shrink_kernel[(nseg, m_blocks)](
        x, a, h, seg.starts_t, seg.lens_t, seg.slots_t,
        fan_in, x.stride(0), a.stride(0), a.stride(1), h.stride(0),
        R=rank, BLOCK_M=BLOCK_M, BLOCK_K=BLOCK_K, PRECISION=precision,
    )  # fmt: skip
    _expand_kernel[(nseg, m_blocks, triton.cdiv(fan_out, BLOCK_N))](
        h, b, y, scaling, seg.starts_t, seg.lens_t, seg.slots_t,
        fan_out, h.stride(0), b.stride(0), b.stride(1), y.stride(0),
        R=rank, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, PRECISION=precision,
    )  # fmt: skip
