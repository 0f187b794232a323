"""Per-layer K and V buffers indexed by KV slot.

Slot indices come from `TokenToKVPoolAllocator`; slot 0 is never handed out, so padded
writes (e.g. a CUDA-graph batch larger than the real one) can target it harmlessly. With a
window pool (`window_pages`) there are two of these: the full layers' and the sliding
layers', each holding buffers for its own layers only.
"""

from __future__ import annotations

from collections.abc import Collection

import torch


class KVBuffers:
    """K and V for every layer: `k[layer]` and `v[layer]` are `[num_slots, kv_heads, head_dim]`."""

    def __init__(
        self,
        num_slots: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layers: Collection[int] | None = None,
    ) -> None:
        """`layers`: the layer ids that get buffers (None: all); the others get empty ones."""
        self.num_slots = num_slots
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        self.layers = frozenset(range(num_layers) if layers is None else layers)

        def buffer(layer: int) -> torch.Tensor:
            rows = num_slots if layer in self.layers else 0
            return torch.zeros((rows, num_kv_heads, head_dim), dtype=dtype, device=device)

        self.k = [buffer(i) for i in range(num_layers)]
        self.v = [buffer(i) for i in range(num_layers)]

    def write(self, layer: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store new K/V rows (`[tokens, kv_heads, head_dim]`) at slots `loc` (`[tokens]`)."""
        self.k[layer][loc] = k.to(self.dtype)
        self.v[layer][loc] = v.to(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        return bytes_per_token(len(self.layers), self.num_kv_heads, self.head_dim, self.dtype)

    @property
    def total_bytes(self) -> int:
        return self.num_slots * self.bytes_per_token


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K plus V for one token across all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8
