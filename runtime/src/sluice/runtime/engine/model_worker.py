"""`ModelWorker`: owns the model, the KV pool and the request table; runs forward + sample."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.batch_invariant import ROW_MULTIPLE, BatchInvariantAttentionBackend
from sluice.runtime.attention.registry import create_attention_backend, resolve_backend_name
from sluice.runtime.engine.cuda_graph import (
    CudaGraphRunner,
    capture_batch_sizes,
    cuda_graph_disabled_reason,
)
from sluice.runtime.ipc.messages import SchedulerReady
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.kv_buffers import KVBuffers, bytes_per_token
from sluice.runtime.memory.req_to_token import ReqToTokenPool
from sluice.runtime.model.forward_batch import ForwardBatch
from sluice.runtime.model.loader import load_model, load_tokenizer
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow, needs_history, sample
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.model_worker")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str, device: str) -> torch.dtype:
    if name == "auto":
        # bf16 matmuls are slow on CPUs without bf16 instructions
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return _DTYPES[name]


def size_kv_pool(args: ServerArgs, device: str, per_token_bytes: int) -> int:
    """KV pool size in tokens: the flag, else the CPU budget, else the GPU memory fraction."""
    if args.max_total_tokens > 0:
        return args.max_total_tokens
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        return gpu_kv_pool_tokens(total, free, args.mem_fraction_static, per_token_bytes)
    return int(args.cpu_kv_cache_gib * 2**30 // per_token_bytes)


def gpu_kv_pool_tokens(total_bytes: int, free_bytes: int, fraction: float, per_token_bytes: int) -> int:
    """KV tokens that fit when weights plus KV pool may take `fraction` of the GPU.

    Called after the weights, the CUDA context and the attention backend's workspace are
    allocated (they are what is in use); CUDA graphs and activations live in the rest,
    `1 - fraction` of the GPU."""
    used = total_bytes - free_bytes
    budget = fraction * total_bytes - used
    if budget < per_token_bytes:
        raise RuntimeError(
            f"--mem-fraction-static {fraction} leaves no room for the KV pool "
            f"({used / 2**30:.1f} GiB of {total_bytes / 2**30:.1f} GiB already in use)"
        )
    return int(budget // per_token_bytes)


class ModelWorker:
    def __init__(self, args: ServerArgs, model_path: str | Path) -> None:
        self.args = args
        self.device = args.resolved_device
        self.dtype = resolve_dtype(args.dtype, self.device)
        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        torch.manual_seed(args.random_seed)
        backend: AttentionBackend = (
            BatchInvariantAttentionBackend()
            if args.enable_deterministic_inference
            else create_attention_backend(args.attention_backend, self.device, page_size=args.page_size)
        )
        self.model, self.model_config = load_model(Path(model_path), self.device, self.dtype, backend)
        self.tokenizer = load_tokenizer(Path(model_path))
        cfg = self.model_config
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = sorted(eos)

        per_token = bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.dtype)
        page = args.page_size
        total = size_kv_pool(args, self.device, per_token) // page * page
        context = args.max_context_len or cfg.context_length
        # one request alone must always fit the pool, so retraction can always make progress
        self.context_len = min(context, total - page)
        if self.context_len < 2:
            raise ValueError(f"KV pool of {total} tokens is too small (page size {page})")
        self.allocator = TokenToKVPoolAllocator(total, page, self.device)
        self.kv = KVBuffers(
            self.allocator.num_slots, cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
            self.dtype, self.device,
        )
        self.req_pool = ReqToTokenPool(args.max_running_requests, self.context_len + page, self.device)
        # the last token sampled for each request row, read by the next decode (overlap)
        self.future_tokens = torch.zeros(args.max_running_requests, dtype=torch.int64, device=self.device)
        self.cache = KVCacheManager.create(self.allocator, self.req_pool, not args.disable_radix_cache)
        logger.info(
            "KV pool: %d tokens, %.1f MiB (%d bytes/token, %s on %s)",
            total, self.kv.total_bytes / 2**20, per_token, self.dtype, self.device,
        )
        self.graph_runner = self._capture_cuda_graphs(backend)

    def _capture_cuda_graphs(self, backend: AttentionBackend) -> CudaGraphRunner | None:
        """Decode CUDA graphs, captured once the pool is sized (so before the scheduler
        reports ready and /health turns 200)."""
        args = self.args
        off = cuda_graph_disabled_reason(
            self.device, backend, args.disable_cuda_graph, args.enable_deterministic_inference
        )
        if off is not None:
            logger.info("decode CUDA graphs off: %s", off)
            return None
        sizes = capture_batch_sizes(args.cuda_graph_max_bs, args.max_running_requests)
        runner = CudaGraphRunner(self.model, sizes)
        runner.capture(self.req_pool.req_to_token, self.kv)
        return runner

    @property
    def attention_backend_name(self) -> str:
        if self.args.enable_deterministic_inference:
            return "batch-invariant"
        return resolve_backend_name(self.args.attention_backend, self.device)

    @property
    def max_total_tokens(self) -> int:
        return self.allocator.size

    def decode_text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def ready_message(self) -> SchedulerReady:
        return SchedulerReady(
            max_total_tokens=self.max_total_tokens,
            max_running_requests=self.args.max_running_requests,
            context_len=self.context_len,
            page_size=self.args.page_size,
            vocab_size=self.model_config.vocab_size,
            eos_token_ids=self.eos_token_ids,
            device=self.device,
            dtype=str(self.dtype).removeprefix("torch."),
            attention_backend=self.attention_backend_name,
        )

    def forward(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> SampleOutput:
        """Forward and sample one batch, synchronously (the normal loop)."""
        return self.run(self.prepare(batch, rows))

    def prepare(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> ForwardJob:
        """Everything the forward needs, snapshotted on the scheduler thread: the scheduler
        may change its requests while the job runs on the forward thread."""
        fb = batch.to_forward_batch(self.req_pool.req_to_token, self.kv, self.device)
        if self.args.enable_deterministic_inference:
            fb = fb.padded(ROW_MULTIPLE)
        return ForwardJob(fb, rows, list(batch.sample_mask), [r.req_pool_idx for r in batch.reqs])

    @torch.inference_mode()
    def run(self, job: ForwardJob) -> SampleOutput:
        """Resolve future tokens, run the model, sample, publish the sampled tokens."""
        fb, rows = job.batch, list(job.rows)
        placeholders = fb.input_ids < 0
        resolved: list[int] = []
        if bool(placeholders.any()):
            slots = (-fb.input_ids - 1).clamp(min=0)
            fb.input_ids = torch.where(placeholders, self.future_tokens[slots], fb.input_ids)
            resolved = fb.input_ids[: len(rows)].tolist()
            for i, row in enumerate(rows):  # penalties must see the in-flight token too
                if bool(placeholders[i]) and row.output_ids is not None and needs_history(row):
                    rows[i] = dataclasses.replace(row, output_ids=[*row.output_ids, resolved[i]])
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb)
        else:
            logits = self.model.forward(fb)
        keep = [i for i, s in enumerate(job.sample_mask) if s]
        n = len(job.sample_mask)
        tokens: list[int] = [-1] * n
        logprobs: list[float | None] = [None] * n
        if keep:
            picked = sample(logits[keep] if len(keep) < n else logits, [rows[i] for i in keep])
            for j, i in enumerate(keep):
                tokens[i], logprobs[i] = picked.token_ids[j], picked.logprobs[j]
            sampled_rows = torch.tensor([job.req_rows[i] for i in keep], device=self.future_tokens.device)
            self.future_tokens[sampled_rows] = torch.tensor(
                picked.token_ids, dtype=torch.int64, device=self.future_tokens.device
            )
        return SampleOutput(tokens, logprobs)


@dataclass(frozen=True)
class ForwardJob:
    batch: ForwardBatch
    rows: list[SamplingRow]
    sample_mask: list[bool]
    req_rows: list[int]
