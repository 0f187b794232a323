"""Batch-invariant matmul in Triton, for `--enable-deterministic-inference` on CUDA.

cuBLAS picks its kernel (tile shape, split-K) by the problem's shape, so a row's result
changes with the number of rows beside it. Here every output tile is one program with one
fixed tile shape (no autotuning, no split-K) that runs over K in fixed steps: an output
element is the same sequence of MMA steps whatever M is, whichever program computes it and
whatever else shares the call. fp32 accumulation; the output bf16/fp16 or fp32 (the LM head).

RMSNorm on CUDA in that mode is `triton_fused.rms_norm`: one program per row; the
batch-invariant attention's score and value GEMMs are `bmm`.

Tested under Triton's interpreter on the CPU (`tests/kernels/test_triton_batch_invariant.py`):
the interpreter checks the indexing, masking and invariance of the program structure; the
GPU's own MMA numerics are checked by `tests/gpu/` on a machine with one.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32
# Triton's interpreter reads bf16 operands of `tl.dot` as raw bits (numpy has no bf16): it
# gets them as fp32, whose products of bf16 values are exact anyway
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit(do_not_specialize=["M", "N"])
def _matmul_kernel(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                   stride_xb, stride_wb, stride_ob,
                   HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                   BK: tl.constexpr, DOT_FP32: tl.constexpr):  # fmt: skip
    batch = tl.program_id(2)
    x_ptr += batch * stride_xb
    w_ptr += batch * stride_wb
    out_ptr += batch * stride_ob
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :],
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)  # fmt: skip
        b = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None],
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)  # fmt: skip
        if DOT_FP32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rm[:, None] * stride_om + rn[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))  # fmt: skip


def matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None) -> torch.Tensor:  # fmt: skip
    """`x @ weight.T + bias` (`x` `[..., K]`, `weight` `[N, K]`), each row's result the same
    whatever else `x` holds."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    w = weight if weight.stride(-1) == 1 else weight.contiguous()
    m, k = rows.shape
    n = w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"x has K={k}, the weight {tuple(w.shape)}")
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    if m and n:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N), 1)
        _matmul_kernel[grid](rows, w, bias if bias is not None else w, out, m, n, k,
                             rows.stride(0), w.stride(0), out.stride(0), 0, 0, 0,
                             HAS_BIAS=bias is not None, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
                             DOT_FP32=_INTERPRETED)  # fmt: skip
    return out.view(*x.shape[:-1], n)


def bmm(x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`x @ w.transpose(-1, -2)` for `x` `[B, M, K]` and `w` `[B, N, K]`, one launch; each
    element the same steps as `matmul`'s (the batch index is one more grid axis)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    w = w if w.stride(-1) == 1 else w.contiguous()
    b, m, k = x.shape
    if w.shape[0] != b or w.shape[2] != k:
        raise ValueError(f"x {tuple(x.shape)} and w {tuple(w.shape)} do not pair")
    n = w.shape[1]
    out = torch.empty(b, m, n, dtype=out_dtype or x.dtype, device=x.device)
    if b and m and n:
        grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N), b)
        _matmul_kernel[grid](x, w, w, out, m, n, k, x.stride(1), w.stride(1), out.stride(1),
                             x.stride(0), w.stride(0), out.stride(0), HAS_BIAS=False,
                             BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K, DOT_FP32=_INTERPRETED)  # fmt: skip
    return out
