"""`HybridWindowAttention`: full layers on the full pool, sliding layers on the window pool.

With a window pool (`memory/window_pages.py`) the sliding-window layers keep their K/V in
buffers of their own, indexed through a slot table of their own (`ForwardBatch.window`).
This backend holds two instances of the same backend, one per kind of layer, each planning
its own view of the batch once per forward; a layer goes to the one its window names. The
backends themselves are unchanged: a windowed layer already reads only its window's keys,
and the window pool keeps exactly those.
"""

from __future__ import annotations

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch


class HybridWindowAttention(AttentionBackend):
    supports_cuda_graph = False  # the window view's tensors are not static buffers

    def __init__(
        self, full: AttentionBackend, windowed: AttentionBackend, full_layers: bool = True
    ) -> None:
        """`full_layers` False: every layer slides (the full view is never planned)."""
        super().__init__(full.scale)
        self.full = full
        self.windowed = windowed
        self.full_layers = full_layers

    def unsupported(self, options: LayerAttention) -> str | None:
        return self.full.unsupported(options)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        if batch.window is None:
            raise RuntimeError("a window pool's forward needs the batch's window view")
        if self.full_layers:
            self.full.init_forward_metadata(batch)
        self.windowed.init_forward_metadata(batch.window)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        if options.window is None:
            return self.full.forward(q, k, v, layer_id, batch, options)
        assert batch.window is not None
        return self.windowed.forward(q, k, v, layer_id, batch.window, options)
