"""`ScheduledBatch`: the requests chosen for one tick, and its `ForwardBatch` for the model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.model.forward_batch import ForwardBatch, ForwardMode
from sluice.runtime.scheduler.request import Req


def future_placeholder(req_pool_idx: int) -> int:
    """A negative input id meaning 'the last token sampled for request row `req_pool_idx`'."""
    return -(req_pool_idx + 1)


@dataclass
class ScheduledBatch:
    """Requests of one forward. For an extend batch, request i computes tokens
    `fill_ids[prefix_lens[i] : prefix_lens[i] + extend_lens[i]]`; `sample_mask[i]` is False
    for a request whose prompt is not complete yet (an intermediate chunk emits no token)."""

    mode: ForwardMode
    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    out_cache_loc: torch.Tensor
    sample_mask: list[bool]

    @property
    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def num_tokens(self) -> int:
        return sum(self.extend_lens)

    def to_forward_batch(self, req_to_token: torch.Tensor, kv: KVBuffers, device: str) -> ForwardBatch:
        input_ids: list[int] = []
        positions: list[int] = []
        for req, start, n in zip(self.reqs, self.prefix_lens, self.extend_lens, strict=True):
            if self.mode is ForwardMode.DECODE:
                if req.pending_tokens:
                    # overlap: the input is the token the in-flight forward is sampling;
                    # the worker reads it from its future-token buffer, slot = request row
                    input_ids.append(future_placeholder(req.req_pool_idx))
                else:
                    input_ids.append(req.output_ids[-1] if req.output_ids else req.input_ids[-1])
            else:
                input_ids.extend(req.fill_ids[start : start + n])
            positions.extend(range(start, start + n))
        seq_lens = [p + n for p, n in zip(self.prefix_lens, self.extend_lens, strict=True)]

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)

        return ForwardBatch(
            mode=self.mode,
            input_ids=t(input_ids),
            positions=t(positions),
            out_cache_loc=self.out_cache_loc.to(device, non_blocking=True),
            req_pool_indices=t([r.req_pool_idx for r in self.reqs]),
            seq_lens=t(seq_lens),
            prefix_lens=t(self.prefix_lens),
            extend_lens=t(self.extend_lens),
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=list(self.prefix_lens),
            extend_lens_cpu=list(self.extend_lens),
            req_to_token=req_to_token,
            kv=kv,
        )
