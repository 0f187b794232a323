"""Rotary position embedding, neox style (rotate-half), as Hugging Face Llama applies it.

The inverse frequencies are computed exactly as transformers does (fp32, on the CPU), so
the cos/sin of a position match the reference bit for bit; cos/sin are computed from the
positions of each forward, which costs one small outer product per forward.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from sluice.runtime.model.config import RopeScaling


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Inverse frequencies `[head_dim // 2]` (fp32) for `default`, `linear`, `llama3` and
    `yarn` RoPE."""
    if scaling.rope_type == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    return inv_freq


def rope_attention_scaling(scaling: RopeScaling) -> float:
    """The factor cos and sin are multiplied by (YaRN's attention factor; 1 otherwise)."""
    if scaling.rope_type != "yarn":
        return 1.0
    if scaling.attention_factor is not None:
        return scaling.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return mscale(scaling.factor, scaling.mscale) / mscale(scaling.factor, scaling.mscale_all_dim)
    return mscale(scaling.factor)


def _yarn_inv_freq(dim: int, base: float, s: RopeScaling) -> torch.Tensor:
    """YaRN (gpt-oss): extrapolated high frequencies, interpolated low ones, a linear ramp
    between the dimensions that turn `beta_fast` and `beta_slow` times over the original
    context; as transformers' `_compute_yarn_parameters`."""

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(s.original_max_position_embeddings / (rotations * 2 * math.pi))) / (
            2 * math.log(base)
        )

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (s.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    return interpolation * (1 - keep) + extrapolation * keep


def _llama3_inv_freq(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    """Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between."""
    low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """Computes cos/sin for a forward's positions and rotates q and k with them."""

    def __init__(
        self, head_dim: int, theta: float, scaling: RopeScaling, device: torch.device | str
    ):
        super().__init__()
        self.head_dim = head_dim
        inv_freq = rope_inv_freq(head_dim, theta, scaling).to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.attention_scaling = rope_attention_scaling(scaling)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[num_tokens, head_dim]` for `positions` `[num_tokens]`."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        if self.attention_scaling != 1.0:
            return (emb.cos() * self.attention_scaling).to(dtype), (
                emb.sin() * self.attention_scaling
            ).to(dtype)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate `x` `[num_tokens, heads, head_dim]` with per-token `cos`/`sin`."""
        cos = cos[:, None, :]
        sin = sin[:, None, :]
        return x * cos + rotate_half(x) * sin
