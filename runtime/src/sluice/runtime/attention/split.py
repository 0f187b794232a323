"""Mixed batches: decode rows and prefill rows in one forward, each on its own kernel path.

A mixed batch (the running decodes plus a prefill chunk, `--disable-mixed-chunk` off) is an
extend batch whose leading rows compute one token each. A one-token row of an extend batch
is exactly a decode step (the token at position p attends to slots 0..p), so this wrapper
gives those rows to a backend instance in decode mode and the rest to one in extend mode.
Any backend works unchanged: each instance only ever sees a plain decode or extend batch.
"""

from __future__ import annotations

import torch

from sluice.runtime.attention.base import FULL_ATTENTION, AttentionBackend, LayerAttention
from sluice.runtime.forward import ForwardBatch, ForwardMode


def leading_single_token_rows(batch: ForwardBatch) -> int:
    n = 0
    for length in batch.extend_lens_cpu:
        if length != 1:
            break
        n += 1
    return n


class SplitBatchAttention(AttentionBackend):
    def __init__(self, decode: AttentionBackend, extend: AttentionBackend) -> None:
        super().__init__(decode.scale)
        self.decode = decode
        self.extend = extend
        # this forward's pieces: (backend, its sub-batch, first token, end token)
        self._parts: list[tuple[AttentionBackend, ForwardBatch, int, int | None]] = []

    @property  # type: ignore[misc]
    def supports_cuda_graph(self) -> bool:  # type: ignore[override]
        return self.decode.supports_cuda_graph  # graphs are captured for decode batches only

    def init_forward_metadata_for_graph(self, batch: ForwardBatch) -> None:
        self._parts = [(self.decode, batch, 0, None)]
        self.decode.init_forward_metadata_for_graph(batch)

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        d = leading_single_token_rows(batch) if batch.mode is ForwardMode.EXTEND else batch.batch_size
        if d == batch.batch_size:
            self._parts = [(self.decode, batch.with_mode(ForwardMode.DECODE), 0, None)]
        elif d == 0:
            self._parts = [(self.extend, batch, 0, None)]
        else:
            self._parts = [
                (self.decode, batch.rows(0, d).with_mode(ForwardMode.DECODE), 0, d),
                (self.extend, batch.rows(d, batch.batch_size), d, None),
            ]
        for backend, part, _, _ in self._parts:
            backend.init_forward_metadata(part)

    def unsupported(self, options: LayerAttention) -> str | None:
        return self.decode.unsupported(options) or self.extend.unsupported(options)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        batch: ForwardBatch,
        options: LayerAttention = FULL_ATTENTION,
    ) -> torch.Tensor:
        if len(self._parts) == 1:
            backend, part, _, _ = self._parts[0]
            return backend.forward(q, k, v, layer_id, part, options)
        outs = [
            backend.forward(q[lo:hi], k[lo:hi], v[lo:hi], layer_id, part, options)
            for backend, part, lo, hi in self._parts
        ]
        return torch.cat(outs)
