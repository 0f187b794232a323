"""CUDA graphs for decode: capture the model's decode forward per batch-size bucket, replay
it with the batch padded to the bucket.

Buckets are 1, 2, 4, 8, then every multiple of 8 up to `--cuda-graph-max-bs` (default
160), capped at the request slots; the cap itself is a bucket, so every decode batch up to
it has one. Each bucket's graph reads static input buffers (token ids, positions, KV
slots, request rows, lengths) and writes static logits. A replay copies the batch into the
buffers and fills the rows past it with padding: token 0 at position 0, writing its K/V to
the reserved slot 0, over a one-token sequence of request row 0 (read, never written, its
output dropped). Graphs share one memory pool and are captured largest first.

The runner depends only on the model, its attention backend and `ForwardBatch`.
"""

from __future__ import annotations

import bisect
import logging
import time
from dataclasses import replace

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers

logger = logging.getLogger("sluice.cuda_graph")

PAD_TOKEN_ID = 0
PAD_SLOT = 0  # never allocated (TokenToKVPoolAllocator reserves page 0)
PAD_REQ_ROW = 0
PAD_SEQ_LEN = 1


def capture_batch_sizes(max_bs: int, max_running_requests: int) -> list[int]:
    """The buckets: 1, 2, 4, 8, 16, 24, 32, ... up to min(max_bs, max_running_requests),
    which is always the last one."""
    cap = min(max_bs, max_running_requests)
    if cap < 1:
        return []
    sizes = [s for s in (1, 2, 4, 8) if s <= cap] + list(range(16, cap + 1, 8))
    if sizes[-1] != cap:
        sizes.append(cap)
    return sizes


def bucket_for(batch_size: int, sizes: list[int]) -> int | None:
    """The smallest bucket that holds `batch_size`, or None when none does."""
    i = bisect.bisect_left(sizes, batch_size)
    return sizes[i] if i < len(sizes) and batch_size >= 1 else None


def cuda_graph_disabled_reason(
    device: str, backend: AttentionBackend, disabled: bool, deterministic: bool
) -> str | None:
    """Why decode runs eagerly (None: capture graphs)."""
    if disabled:
        return "--disable-cuda-graph"
    if not device.startswith("cuda"):
        return f"the device is {device}"
    if deterministic:
        return "--enable-deterministic-inference runs the batch-invariant backend eagerly"
    if not backend.supports_cuda_graph:
        return f"the {type(backend).__name__} cannot be captured (its shapes follow the lengths)"
    return None


class DecodeGraphInputs:
    """The static buffers every captured graph reads, sized for the largest bucket."""

    def __init__(self, max_bs: int, device: torch.device | str) -> None:
        def buffer(fill: int) -> torch.Tensor:
            return torch.full((max_bs,), fill, dtype=torch.int64, device=device)

        self.max_bs = max_bs
        self.input_ids = buffer(PAD_TOKEN_ID)
        self.positions = buffer(0)
        self.out_cache_loc = buffer(PAD_SLOT)
        self.req_pool_indices = buffer(PAD_REQ_ROW)
        self.seq_lens = buffer(PAD_SEQ_LEN)
        self.prefix_lens = buffer(PAD_SEQ_LEN - 1)
        self.extend_lens = buffer(1)

    def _fields(self) -> dict[str, tuple[torch.Tensor, int]]:
        """ForwardBatch field -> (its buffer, the value of padding rows)."""
        return {
            "input_ids": (self.input_ids, PAD_TOKEN_ID),
            "positions": (self.positions, 0),
            "out_cache_loc": (self.out_cache_loc, PAD_SLOT),
            "req_pool_indices": (self.req_pool_indices, PAD_REQ_ROW),
            "seq_lens": (self.seq_lens, PAD_SEQ_LEN),
            "prefix_lens": (self.prefix_lens, PAD_SEQ_LEN - 1),
            "extend_lens": (self.extend_lens, 1),
        }

    def template(self, req_to_token: torch.Tensor, kv: KVBuffers) -> ForwardBatch:
        """A one-row padding batch over the pool: what `view` fills in."""
        bs = 1
        return ForwardBatch(
            mode=ForwardMode.DECODE,
            **{name: buf[:bs] for name, (buf, _) in self._fields().items()},
            seq_lens_cpu=[PAD_SEQ_LEN],
            prefix_lens_cpu=[PAD_SEQ_LEN - 1],
            extend_lens_cpu=[1],
            req_to_token=req_to_token,
            kv=kv,
        )

    def view(self, template: ForwardBatch, bs: int, seq_lens_cpu: list[int]) -> ForwardBatch:
        """A decode `ForwardBatch` over the first `bs` rows of the buffers, with the pool
        tensors (`req_to_token`, `kv`) of `template`."""
        return replace(
            template,
            mode=ForwardMode.DECODE,
            **{name: buf[:bs] for name, (buf, _) in self._fields().items()},
            seq_lens_cpu=seq_lens_cpu,
            prefix_lens_cpu=[n - 1 for n in seq_lens_cpu],
            extend_lens_cpu=[1] * bs,
            return_all_logits=False,
            row_multiple=1,
        )

    def load(self, batch: ForwardBatch, bucket: int) -> ForwardBatch:
        """Copy decode `batch` into the buffers, pad rows up to `bucket`, and return the
        padded batch (what the bucket's graph computes)."""
        bs = batch.batch_size
        if not bs <= bucket <= self.max_bs:
            raise ValueError(f"batch of {bs} does not fit bucket {bucket} (max {self.max_bs})")
        for name, (buf, pad) in self._fields().items():
            buf[:bs].copy_(getattr(batch, name), non_blocking=True)
            if bucket > bs:
                buf[bs:bucket].fill_(pad)
        seq_lens_cpu = [*batch.seq_lens_cpu, *[PAD_SEQ_LEN] * (bucket - bs)]
        return self.view(batch, bucket, seq_lens_cpu)


class CudaGraphRunner:
    """Captured decode graphs for one model; `can_run` then `replay` in place of
    `model.forward` for a decode batch."""

    def __init__(self, model: torch.nn.Module, batch_sizes: list[int]) -> None:
        if not batch_sizes:
            raise ValueError("no CUDA-graph batch sizes to capture")
        self.model = model
        self.backend = model.attn_backend
        self.batch_sizes = sorted(batch_sizes)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self._inputs: DecodeGraphInputs | None = None
        self.capture_seconds = 0.0
        self.capture_bytes = 0

    @property
    def max_batch_size(self) -> int:
        return self.batch_sizes[-1]

    def can_run(self, batch: ForwardBatch) -> bool:
        return (
            batch.mode == ForwardMode.DECODE
            and bool(self.graphs)
            and batch.batch_size <= self.max_batch_size
            and batch.num_tokens == batch.batch_size
            and not batch.return_all_logits
            and batch.row_multiple == 1
        )

    @torch.inference_mode()
    def capture(self, req_to_token: torch.Tensor, kv: KVBuffers) -> None:
        """Capture every bucket over the pool's request table and KV buffers; logs how
        long it took and the device memory it took."""
        device = req_to_token.device
        self._inputs = DecodeGraphInputs(self.max_batch_size, device)
        template = self._inputs.template(req_to_token, kv)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        torch.cuda.synchronize(device)
        free_before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        for bs in reversed(self.batch_sizes):  # largest first: later ones reuse its pool
            batch = self._inputs.view(template, bs, [PAD_SEQ_LEN] * bs)
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile kernels, create handles, learn head shapes
                    self.model.forward(batch)
                self.backend.init_forward_metadata_for_graph(batch)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    self.logits[bs] = self.model.forward(batch)
            self.graphs[bs] = graph
        torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start
        self.capture_bytes = max(0, free_before - torch.cuda.mem_get_info(device)[0])
        logger.info(
            "captured %d decode CUDA graphs (batch sizes %s) in %.1f s, %.0f MiB",
            len(self.graphs), _ranges(self.batch_sizes), self.capture_seconds,
            self.capture_bytes / 2**20,
        )  # fmt: skip

    @torch.inference_mode()
    def replay(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits `[batch_size, vocab]` of a decode batch, as `model.forward` gives."""
        assert self._inputs is not None
        bucket = bucket_for(batch.batch_size, self.batch_sizes)
        assert bucket is not None
        padded = self._inputs.load(batch, bucket)
        self.backend.init_forward_metadata_for_graph(padded)
        self.graphs[bucket].replay()
        return self.logits[bucket][: batch.batch_size].clone()


def _ranges(sizes: list[int]) -> str:
    return f"{sizes[0]}..{sizes[-1]}" if len(sizes) > 2 else ",".join(map(str, sizes))
