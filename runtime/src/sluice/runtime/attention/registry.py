"""Choose an attention backend by name (`--attention-backend`)."""

from __future__ import annotations

import torch

from sluice.runtime import constants
from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend
from sluice.runtime.attention.torch_backend import TorchAttentionBackend

_NOT_YET_AVAILABLE = ("triton", "flashinfer")


def resolve_backend_name(name: str, device: str | torch.device) -> str:
    """The concrete backend `name` stands for on `device` (`auto` picks by device)."""
    if name not in constants.ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; choose one of {', '.join(constants.ATTENTION_BACKENDS)}"
        )
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto":
        # the CPU gets the in-place paged kernels; torch elsewhere until triton/flashinfer exist
        return "cpu" if on_cpu else "torch"
    if name == "cpu" and not on_cpu:
        raise ValueError(f"attention backend 'cpu' runs on the CPU only, not on {device}")
    return name


def create_attention_backend(
    name: str, device: str | torch.device, *, scale: float | None = None
) -> AttentionBackend:
    """Build the backend `name` for `device`; `scale` defaults to `1 / sqrt(head_dim)`."""
    resolved = resolve_backend_name(name, device)
    if resolved in _NOT_YET_AVAILABLE:
        raise ValueError(
            f"attention backend {resolved!r} is not available yet; use 'torch', 'cpu' or 'auto'"
        )
    if resolved == "cpu":
        return CpuAttentionBackend(scale=scale)
    return TorchAttentionBackend(scale=scale)
