"""Fused Triton kernels for the GPU's per-layer elementwise work, one pass over HBM each:

- `fused_add_rms_norm(x, residual, weight, eps)`: `residual += x` and the RMSNorm of the
  sum (in fp32, rounded to the input dtype before the weight, as HF's `LlamaRMSNorm`), in
  place: `x` gets the normed values, `residual` the sum (vLLM's and SGLang's contract);
- `rms_norm(x, weight, eps)`: the same without a residual (into a new tensor);
- `rope_qk(q, k, cos, sin)`: neox-style rotary embedding of q and k together, in place
  (`cos`/`sin` `[tokens, head_dim]` as `RotaryEmbedding.cos_sin` gives them);
- `silu_mul(gate_up)`: `silu(gate) * up` of the `[tokens, 2 * inter]` gate-up projection.

On the CPU they run under Triton's interpreter (`TRITON_INTERPRET=1`), which is how the
tests prove them against the torch ops (tests/kernels/test_triton_fused.py). They are not
wired into the model yet (the model code is another change's); the GPU check can time them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _block(n: int) -> int:
    return triton.next_power_of_2(n)


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, stride_x, stride_r, n_cols, eps,
                         HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)  # the sum, rounded like torch's
        tl.store(res_ptr + row * stride_r + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    var = tl.sum(x32 * x32, axis=0) / n_cols
    normed = (x32 * tl.rsqrt(var + eps)).to(x_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(x_ptr + row * stride_x + cols, (w.to(tl.float32) * normed.to(tl.float32)).to(x_ptr.dtype.element_ty), mask=mask)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: `residual <- x + residual`, `x <- RMSNorm(residual) * weight` (`[tokens, hidden]`)."""
    rows, cols = x.shape
    if rows:
        _add_rms_norm_kernel[(rows,)](x, residual, weight, x.stride(0), residual.stride(0), cols,
                                      eps, HAS_RESIDUAL=True, BLOCK=_block(cols))  # fmt: skip


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    out = x.clone()
    rows, cols = out.shape
    if rows:
        _add_rms_norm_kernel[(rows,)](out, out, weight, out.stride(0), out.stride(0), cols, eps,
                                      HAS_RESIDUAL=False, BLOCK=_block(cols))  # fmt: skip
    return out


@triton.jit
def _rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
                 stride_c, n_q_heads, n_k_heads, HALF: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """One program per token: every q head and k head of it, first half and second half."""
    t = tl.program_id(0)
    d = tl.arange(0, HALF)
    cos1 = tl.load(cos_ptr + t * stride_c + d).to(tl.float32)
    cos2 = tl.load(cos_ptr + t * stride_c + HALF + d).to(tl.float32)
    sin1 = tl.load(sin_ptr + t * stride_c + d).to(tl.float32)
    sin2 = tl.load(sin_ptr + t * stride_c + HALF + d).to(tl.float32)
    heads = tl.arange(0, BLOCK_H)
    for which in tl.static_range(2):
        if which == 0:
            base, st, sh, n = q_ptr, stride_qt, stride_qh, n_q_heads
        else:
            base, st, sh, n = k_ptr, stride_kt, stride_kh, n_k_heads
        hmask = heads[:, None] < n
        ptr = base + t * st + heads[:, None] * sh + d[None, :]
        x1 = tl.load(ptr, mask=hmask, other=0.0)
        x2 = tl.load(ptr + HALF, mask=hmask, other=0.0)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), in fp32 then rounded once
        # (the torch ops round each product: equal in fp32, within a bf16 ulp in bf16)
        tl.store(ptr, (a * cos1[None, :] - b * sin1[None, :]).to(x1.dtype), mask=hmask)
        tl.store(ptr + HALF, (b * cos2[None, :] + a * sin2[None, :]).to(x1.dtype), mask=hmask)


def rope_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q `[tokens, q_heads, head_dim]` and k `[tokens, k_heads, head_dim]` in place."""
    tokens, q_heads, head_dim = q.shape
    k_heads = k.shape[1]
    if tokens == 0:
        return
    if q.stride(2) != 1 or k.stride(2) != 1 or cos.stride(1) != 1 or sin.stride(1) != 1:
        raise ValueError("rope_qk needs the head dimension contiguous")
    _rope_kernel[(tokens,)](q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                            cos.stride(0), q_heads, k_heads, HALF=head_dim // 2,
                            BLOCK_H=_block(max(q_heads, k_heads)))  # fmt: skip


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, stride_x, stride_o, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    start = tl.program_id(1) * BLOCK
    cols = start + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * stride_x + n_cols + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    silu = (g / (1.0 + tl.exp(-g))).to(gate.dtype)  # F.silu rounds to the dtype, then * up
    tl.store(out_ptr + row * stride_o + cols, (silu.to(tl.float32) * up.to(tl.float32)).to(gate.dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """`silu(gate) * up` for `gate_up` `[tokens, 2 * inter]` (gate first)."""
    rows, width = gate_up.shape
    inter = width // 2
    out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
    if rows:
        block = min(1024, _block(inter))
        _silu_mul_kernel[(rows, triton.cdiv(inter, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block
        )
    return out
