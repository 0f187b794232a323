"""What one forward pass reads: token ids, positions, and where each request's KV lives."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import torch

from sluice.runtime.memory.kv_buffers import KVBuffers


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill: new prompt tokens on top of a (possibly empty) cached prefix
    DECODE = "decode"  # one new token per request


@dataclass
class ForwardBatch:
    """One batch of requests for the model.

    Tokens of all requests are concatenated in request order (`[num_tokens]` tensors).
    Request `i` owns row `req_pool_indices[i]` of `req_to_token`; its first `seq_lens[i]`
    entries are the KV slots of its whole sequence *including* the tokens of this forward,
    whose slots are also given flat in `out_cache_loc`. The attention backend writes the new
    K/V to `out_cache_loc` and attends causally over the request's row.
    """

    mode: ForwardMode
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    out_cache_loc: torch.Tensor  # [num_tokens] int64, KV slot of each new token
    req_pool_indices: torch.Tensor  # [batch] int64
    seq_lens: torch.Tensor  # [batch] int64, prefix + new tokens
    prefix_lens: torch.Tensor  # [batch] int64, tokens already in the KV cache
    extend_lens: torch.Tensor  # [batch] int64, new tokens (1 for decode)
    seq_lens_cpu: list[int]
    prefix_lens_cpu: list[int]
    extend_lens_cpu: list[int]
    req_to_token: torch.Tensor  # [max_running_requests, max_context_len] int32
    kv: KVBuffers
    return_all_logits: bool = False  # tests: logits at every position, not only the last
    # more token indices whose logits are wanted (prompt logprobs), after the last tokens'
    extra_logit_indices: torch.Tensor | None = None
    # deterministic mode: every matmul's row count is a multiple of this (see `padded`)
    row_multiple: int = 1
    # with a window pool: this batch as the sliding-window layers see it (their own K/V,
    # slot table and new slots; everything else the same)
    window: ForwardBatch | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def last_token_indices(self) -> torch.Tensor:
        """Index into the flat token dimension of each request's last new token."""
        return torch.cumsum(self.extend_lens, dim=0) - 1

    def with_mode(self, mode: ForwardMode) -> ForwardBatch:
        if mode is self.mode:
            return self
        window = self.window.with_mode(mode) if self.window is not None else None
        return replace(self, mode=mode, window=window)

    def rows(self, lo: int, hi: int) -> ForwardBatch:
        """Requests [lo, hi) as a batch of their own (their tokens, slots and lengths); the
        last piece keeps any padding tokens."""
        first = sum(self.extend_lens_cpu[:lo])
        end = sum(self.extend_lens_cpu[:hi]) if hi < self.batch_size else self.num_tokens
        return replace(
            self,
            window=self.window.rows(lo, hi) if self.window is not None else None,
            input_ids=self.input_ids[first:end],
            positions=self.positions[first:end],
            out_cache_loc=self.out_cache_loc[first:end],
            req_pool_indices=self.req_pool_indices[lo:hi],
            seq_lens=self.seq_lens[lo:hi],
            prefix_lens=self.prefix_lens[lo:hi],
            extend_lens=self.extend_lens[lo:hi],
            seq_lens_cpu=self.seq_lens_cpu[lo:hi],
            prefix_lens_cpu=self.prefix_lens_cpu[lo:hi],
            extend_lens_cpu=self.extend_lens_cpu[lo:hi],
        )

    def padded(self, multiple: int) -> ForwardBatch:
        """This batch with dummy tokens appended so the token count is a multiple of
        `multiple` (at least one multiple). CPU GEMMs give bitwise-equal rows only for such
        row counts; the dummy tokens belong to no request and write KV to reserved slot 0."""
        extra = max(multiple, -(-self.num_tokens // multiple) * multiple) - self.num_tokens

        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.new_zeros(extra)]) if extra else x

        return replace(
            self,
            window=self.window.padded(multiple) if self.window is not None else None,
            input_ids=pad(self.input_ids),
            positions=pad(self.positions),
            out_cache_loc=pad(self.out_cache_loc),
            row_multiple=multiple,
        )


@dataclass(frozen=True)
class WindowKV:
    """The sliding-window layers' K/V (the window pool) and their KV-slot table, laid out
    as the full ones (`req_to_token[row, pos]`: the window slot of that position)."""

    kv: KVBuffers
    req_to_token: torch.Tensor

    def attach_view(self, batch: ForwardBatch, out_cache_loc: torch.Tensor) -> ForwardBatch:
        """`batch` with its sliding layers' view (`out_cache_loc`: their new tokens' slots)."""
        batch.window = replace(
            batch, out_cache_loc=out_cache_loc, req_to_token=self.req_to_token, kv=self.kv
        )
        return batch
