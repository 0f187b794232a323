"""Drive a model over a real paged KV pool the way the scheduler does, for backend tests.

`PagedSession` owns a `TokenToKVPoolAllocator`, `KVBuffers` and a request table; it
prefills prompts (optionally in chunks, each chunk reading the earlier ones as cached
prefix) and builds decode batches, returning the model's logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.memory.request_slots import RequestSlots


@dataclass
class PagedSession:
    model: torch.nn.Module
    page_size: int = 1
    max_total_tokens: int = 4096
    max_requests: int = 32
    max_context: int = 1024
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    allocator: TokenToKVPoolAllocator = field(init=False)
    kv: KVBuffers = field(init=False)
    table: RequestSlots = field(init=False)
    req_to_token: torch.Tensor = field(init=False)
    rows: list[int] = field(default_factory=list)
    lens: list[int] = field(default_factory=list)
    pages: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        c = getattr(self.model, "local_config", self.model.config)  # this rank's KV heads
        self.allocator = TokenToKVPoolAllocator(self.max_total_tokens, self.page_size)
        self.kv = KVBuffers(self.allocator.num_slots, c.num_hidden_layers, c.num_key_value_heads,
                            c.head_dim, self.dtype, self.device)  # fmt: skip
        self.table = RequestSlots(self.max_requests, self.max_context)
        self.req_to_token = torch.zeros(
            (self.max_requests, self.max_context), dtype=torch.int32, device=self.device
        )

    def add_requests(self, count: int) -> list[int]:
        """New request indices (into `rows`/`lens`), each with a table row and no tokens."""
        first = len(self.rows)
        for _ in range(count):
            row = self.table.alloc()
            assert row is not None
            self.rows.append(row)
            self.lens.append(0)
            self.pages.append([])
        return list(range(first, first + count))

    def _slots(self, req: int, count: int) -> torch.Tensor:
        start, end = self.lens[req], self.lens[req] + count
        need = self.allocator.pages_for(end) - len(self.pages[req])
        if need > 0:
            pages = self.allocator.alloc_pages(need)
            assert pages is not None, "KV pool exhausted"
            self.pages[req] += pages
        slots = torch.tensor(self.allocator.slots(self.pages[req], start, end), dtype=torch.int64)
        self.req_to_token[self.rows[req], start:end] = slots.to(self.device, torch.int32)
        return slots

    def batch(self, mode: ForwardMode, work: list[tuple[int, list[int]]]) -> ForwardBatch:
        """The batch computing `(request, new token ids)` for each entry; allocates their
        slots and advances the lengths (the forward must then run)."""
        ids, positions, locs, prefix, extend = [], [], [], [], []
        for req, tokens in work:
            prefix.append(self.lens[req])
            extend.append(len(tokens))
            positions += range(self.lens[req], self.lens[req] + len(tokens))
            locs.append(self._slots(req, len(tokens)))
            ids += tokens
            self.lens[req] += len(tokens)
        seq = [p + e for p, e in zip(prefix, extend, strict=True)]

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=self.device)

        return ForwardBatch(
            mode=mode, input_ids=t(ids), positions=t(positions),
            out_cache_loc=torch.cat(locs).to(self.device),
            req_pool_indices=t([self.rows[r] for r, _ in work]), seq_lens=t(seq),
            prefix_lens=t(prefix), extend_lens=t(extend), seq_lens_cpu=seq,
            prefix_lens_cpu=prefix, extend_lens_cpu=extend,
            req_to_token=self.req_to_token, kv=self.kv,
        )  # fmt: skip

    def prefill(self, prompts: list[list[int]], chunk: int = 0) -> tuple[list[int], torch.Tensor]:
        """Prefill new requests (in chunks of `chunk` tokens if > 0, one request chunked at a
        time as the scheduler does); returns their indices and last-token logits."""
        reqs = self.add_requests(len(prompts))
        if chunk <= 0:
            logits = self.model.forward(self.batch(ForwardMode.EXTEND, list(zip(reqs, prompts,
                                                                               strict=True))))  # fmt: skip
            return reqs, logits
        last = []
        for req, prompt in zip(reqs, prompts, strict=True):
            for start in range(0, len(prompt), chunk):
                out = self.model.forward(
                    self.batch(ForwardMode.EXTEND, [(req, prompt[start : start + chunk])])
                )
            last.append(out)
        return reqs, torch.cat(last)

    def decode_batch(self, reqs: list[int], tokens: list[int]) -> ForwardBatch:
        return self.batch(ForwardMode.DECODE, [(r, [t]) for r, t in zip(reqs, tokens, strict=True)])
