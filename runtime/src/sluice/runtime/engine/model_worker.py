"""`ModelWorker`: owns the model, the KV pool and the request table; runs forward + sample."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.batch_invariant import ROW_MULTIPLE, BatchInvariantAttentionBackend
from sluice.runtime.attention.registry import resolve_backend_name
from sluice.runtime.engine.cpu_features import choose_dtype, choose_kv_dtype
from sluice.runtime.ipc.messages import SchedulerReady
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.kv_buffers import KVBuffers, bytes_per_token
from sluice.runtime.memory.req_to_token import ReqToTokenPool
from sluice.runtime.model import cpu_fused_ops
from sluice.runtime.model.forward_batch import ForwardBatch
from sluice.runtime.model.loader import load_model, load_tokenizer
from sluice.runtime.model.quantization import quantize_model
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow, needs_history, sample
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.threads import model_worker_threads

logger = logging.getLogger("sluice.model_worker")


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """`--dtype` on `device`; `auto` looks at the CPU (see `cpu_features.choose_dtype`)."""
    return choose_dtype(name, device).dtype


def size_kv_pool(args: ServerArgs, device: str, per_token_bytes: int) -> int:
    """KV pool size in tokens: the flag, else the CPU budget, else the GPU memory fraction."""
    if args.max_total_tokens > 0:
        return args.max_total_tokens
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        used = total - free  # weights and the CUDA context are loaded by now
        budget = args.mem_fraction_static * total - used
        if budget <= 0:
            raise RuntimeError(
                f"--mem-fraction-static {args.mem_fraction_static} leaves no room for the KV pool "
                f"({used / 2**30:.1f} GiB of {total / 2**30:.1f} GiB already in use)"
            )
        return int(budget // per_token_bytes)
    return int(args.cpu_kv_cache_gib * 2**30 // per_token_bytes)


class ModelWorker:
    def __init__(self, args: ServerArgs, model_path: str | Path) -> None:
        self.args = args
        self.device = args.resolved_device
        choice = choose_dtype(args.dtype, self.device, deterministic=args.enable_deterministic_inference)
        self.dtype, self.dtype_reason = choice.dtype, choice.reason
        self.kv_dtype = choose_kv_dtype(args.kv_cache_dtype, self.dtype)
        logger.info("dtype %s (%s), KV cache %s", choice.name, choice.reason, self.kv_dtype)
        if self.device == "cpu" or args.torch_threads > 0:
            threads, why = model_worker_threads(args.torch_threads, torch.get_num_threads())
            torch.set_num_threads(threads)
            logger.info("model worker: %d torch threads (%s)", threads, why)
        torch.manual_seed(args.random_seed)
        backend: str | AttentionBackend = args.attention_backend
        if args.enable_deterministic_inference:
            backend = BatchInvariantAttentionBackend()
        self.model, self.model_config = load_model(Path(model_path), self.device, self.dtype, backend)
        if (quantized := quantize_model(self.model, args.quantization)) > 0:
            logger.info("quantization %s: %d linear layers", args.quantization, quantized)
        if self.device == "cpu" and (reason := cpu_fused_ops.enable(self.model)) is not None:
            logger.warning("fused CPU ops unavailable (%s); running the torch ops", reason)
        self.tokenizer = load_tokenizer(Path(model_path))
        cfg = self.model_config
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(int(self.tokenizer.eos_token_id))
        self.eos_token_ids = sorted(eos)

        per_token = bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, self.kv_dtype)
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
            total, self.kv.total_bytes / 2**20, per_token, self.kv_dtype, self.device,
        )

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
            dtype_reason=self.dtype_reason,
            kv_cache_dtype=str(self.kv_dtype).removeprefix("torch."),
            quantization=self.args.quantization,
            torch_threads=torch.get_num_threads(),
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
