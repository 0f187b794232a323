"""The fused Triton kernels against the torch ops they replace (Sluice's own RMSNorm,
rotary embedding and SwiGLU), under Triton's interpreter on the CPU."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from sluice.runtime.model.config import RopeScaling
from sluice.runtime.model.layers import RMSNorm
from sluice.runtime.model.rotary import RotaryEmbedding

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


def _norm(hidden: int, dtype: torch.dtype, gen: torch.Generator) -> RMSNorm:
    norm = RMSNorm(hidden, 1e-6, DEVICE, dtype)
    norm.weight.data.copy_(1 + 0.1 * torch.randn(hidden, generator=gen))
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "hidden"), [(5, 64), (3, 96)])
def test_fused_add_rms_norm_is_the_residual_sum_and_its_rmsnorm(dtype, tokens, hidden):
    from sluice.runtime.kernels.triton_fused import fused_add_rms_norm, rms_norm

    gen = torch.Generator().manual_seed(tokens * hidden)
    norm = _norm(hidden, dtype, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(tokens, hidden, generator=gen).to(dtype).to(DEVICE)
    want_sum = x + residual
    want = norm(want_sum)
    got_x, got_res = x.clone(), residual.clone()
    fused_add_rms_norm(got_x, got_res, norm.weight, norm.eps)
    # the sum is exact in fp32; in bf16 within one rounding (the interpreter's bf16 cast
    # truncates where the GPU rounds to nearest)
    torch.testing.assert_close(got_res, want_sum, atol=0, rtol=0 if dtype == torch.float32 else 2**-7)
    torch.testing.assert_close(got_x, want, **TOL[dtype])
    torch.testing.assert_close(rms_norm(x, norm.weight, norm.eps), norm(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("q_heads", "k_heads", "head_dim"), [(4, 2, 16), (8, 8, 64), (6, 1, 32)])
def test_rope_rotates_q_and_k_together_as_the_rotary_embedding(dtype, q_heads, k_heads, head_dim):
    from sluice.runtime.kernels.triton_fused import rope_qk

    gen = torch.Generator().manual_seed(q_heads * head_dim)
    tokens = 7
    rotary = RotaryEmbedding(head_dim, 10000.0, RopeScaling(), DEVICE)
    positions = torch.tensor([0, 1, 5, 17, 300, 2047, 4096], device=DEVICE)
    cos, sin = rotary.cos_sin(positions, dtype)
    q = torch.randn(tokens, q_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    k = torch.randn(tokens, k_heads, head_dim, generator=gen).to(dtype).to(DEVICE)
    want_q, want_k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
    got_q, got_k = q.clone(), k.clone()
    rope_qk(got_q, got_k, cos, sin)
    torch.testing.assert_close(got_q, want_q, **TOL[dtype])
    torch.testing.assert_close(got_k, want_k, **TOL[dtype])


def test_rope_works_on_q_and_k_views_of_one_qkv_projection():
    """The model splits one qkv matmul: q and k are strided views, rotated in place."""
    from sluice.runtime.kernels.triton_fused import rope_qk

    gen = torch.Generator().manual_seed(3)
    tokens, q_heads, k_heads, head_dim = 4, 4, 2, 16
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * head_dim, generator=gen).to(DEVICE)
    q = qkv[:, : q_heads * head_dim].view(tokens, q_heads, head_dim)
    k = qkv[:, q_heads * head_dim : (q_heads + k_heads) * head_dim].view(tokens, k_heads, head_dim)
    v_before = qkv[:, (q_heads + k_heads) * head_dim :].clone()
    rotary = RotaryEmbedding(head_dim, 10000.0, RopeScaling(), DEVICE)
    cos, sin = rotary.cos_sin(torch.arange(tokens, device=DEVICE) * 7, torch.float32)
    want_q, want_k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
    rope_qk(q, k, cos, sin)
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(qkv[:, (q_heads + k_heads) * head_dim :], v_before)  # v untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("tokens", "inter"), [(3, 48), (2, 1500)])
def test_silu_mul_is_silu_of_gate_times_up(dtype, tokens, inter):
    from sluice.runtime.kernels.triton_fused import silu_mul

    gen = torch.Generator().manual_seed(inter)
    gate_up = (2 * torch.randn(tokens, 2 * inter, generator=gen)).to(dtype).to(DEVICE)
    gate, up = gate_up.split(inter, dim=-1)
    torch.testing.assert_close(silu_mul(gate_up), F.silu(gate) * up, **TOL[dtype])
