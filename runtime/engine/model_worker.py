"""`ModelWorker`: owns the model, the KV pool and the request table; runs forward + sample."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.batch_invariant import ROW_MULTIPLE, BatchInvariantAttentionBackend
from sluice.runtime.attention.registry import resolve_backend_name
from sluice.runtime.ipc.messages import SchedulerReady
from sluice.runtime.memory.allocator import TokenToKVPoolAllocator
from sluice.runtime.memory.kv_buffers import KVBuffers, bytes_per_token
from sluice.runtime.memory.req_to_token import ReqToTokenPool
from sluice.runtime.model.loader import load_model, load_tokenizer
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow, sample
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
        self.dtype = resolve_dtype(args.dtype, self.device)
        if args.torch_threads > 0:
            torch.set_num_threads(args.torch_threads)
        torch.manual_seed(args.random_seed)
        backend: str | AttentionBackend = args.attention_backend
        if args.enable_deterministic_inference:
            backend = BatchInvariantAttentionBackend()
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
        self.cache = KVCacheManager.create(self.allocator, self.req_pool, not args.disable_radix_cache)
        logger.info(
            "KV pool: %d tokens, %.1f MiB (%d bytes/token, %s on %s)",
            total, self.kv.total_bytes / 2**20, per_token, self.dtype, self.device,
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
        )

    @torch.inference_mode()
    def forward(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> SampleOutput:
        fb = batch.to_forward_batch(self.req_pool.req_to_token, self.kv, self.device)
        if self.args.enable_deterministic_inference:
            fb = fb.padded(ROW_MULTIPLE)
        logits = self.model.forward(fb)
        keep = [i for i, s in enumerate(batch.sample_mask) if s]
        if not keep:
            return SampleOutput([-1] * batch.batch_size, [None] * batch.batch_size)
        if len(keep) < batch.batch_size:
            picked = sample(logits[keep], [rows[i] for i in keep])
            tokens, logprobs = [-1] * batch.batch_size, [None] * batch.batch_size
            for j, i in enumerate(keep):
                tokens[i], logprobs[i] = picked.token_ids[j], picked.logprobs[j]
            return SampleOutput(tokens, logprobs)
        return sample(logits, rows)
