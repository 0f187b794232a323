"""Defaults sized from the GPU's memory, SGLang's rules as the reference: the flags
`--chunked-prefill-size`, `--cuda-graph-max-bs` and `--max-running-requests` at 0 mean
"auto". On the CPU auto is 64 / 2048 / 160 (`server_args.CPU_AUTO_SIZES`, filled at once); on a
GPU `resolve_gpu_defaults` fills them once, in the launching process (so the API's limits
and the scheduler agree) and again, with the same result, where a worker is built directly.

By GPU memory (SGLang's `_handle_gpu_memory_settings`, tensor parallelism below 4):

    < 20 GiB  chunk 2048, graph batch 8       < 35 GiB  chunk 2048, graph batch 24
    < 60 GiB  chunk 4096, graph batch 32      < 90 GiB  chunk 8192, graph batch 256
    < 160 GiB chunk 8192, graph batch 256     else      chunk 16384, graph batch 512

(with 4 or more ranks the graph batch is 80 / 160 / 512 / 512 from 20 GiB up). Running
requests follow the KV pool (SGLang's `max_num_reqs`): 512 per context length's worth of
KV tokens, at least 2048, at most 4096; the pool is estimated before loading the weights
(`mem_fraction_static` of the GPU less the weight files), so every process gets the same
number.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("sluice.gpu_defaults")

GIB = 2**30
MIN_RUNNING, MAX_RUNNING, RUNNING_PER_CONTEXT = 2048, 4096, 512

# (below this many GiB, chunked prefill, graph batch with tp < 4, graph batch with tp >= 4)
_BY_MEMORY = (
    (20, 2048, 8, 8),
    (35, 2048, 24, 80),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
)
_LARGEST = (16384, 512, 512)


@dataclass(frozen=True)
class MemoryDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int


def memory_defaults(gpu_bytes: int, tp_size: int = 1) -> MemoryDefaults:
    """Chunk size and largest graph batch for a GPU of `gpu_bytes`."""
    gib = gpu_bytes / GIB
    for below, chunk, small_tp, large_tp in _BY_MEMORY:
        if gib < below:
            return MemoryDefaults(chunk, small_tp if tp_size < 4 else large_tp)
    chunk, small_tp, large_tp = _LARGEST
    return MemoryDefaults(chunk, small_tp if tp_size < 4 else large_tp)


def running_requests(kv_tokens: int, context_len: int) -> int:
    """Request slots for a pool of `kv_tokens` serving up to `context_len` per request."""
    return min(max(int(kv_tokens / max(context_len, 1) * RUNNING_PER_CONTEXT), MIN_RUNNING), MAX_RUNNING)


def weight_bytes(model_path: Path) -> int:
    """The weight files' size (safetensors, or a GGUF file)."""
    if model_path.is_file():
        return model_path.stat().st_size
    return sum(p.stat().st_size for p in model_path.glob("*.safetensors"))


def estimated_kv_tokens(args: Any, gpu_bytes: int, model_path: Path, per_token_bytes: int) -> int:
    """The KV pool the worker will size, before anything is loaded (each rank holds
    1/tp of the weights and of the KV heads, so the ratio is the same on every rank)."""
    if args.max_total_tokens > 0:
        return int(args.max_total_tokens)
    tp = max(int(getattr(args, "tensor_parallel_size", 1) or 1), 1)
    budget = args.mem_fraction_static * gpu_bytes - weight_bytes(model_path) / tp
    return max(int(budget // max(per_token_bytes // tp, 1)), 0)


def needs_resolving(args: Any) -> bool:
    return 0 in (args.chunked_prefill_size, args.cuda_graph_max_bs, args.max_running_requests)


def resolve_gpu_defaults(
    args: Any, gpu_bytes: int, model_path: Path, per_token_bytes: int, context_len: int
) -> Any:
    """`args` with every auto (0) of the three flags replaced for a GPU of `gpu_bytes`;
    `per_token_bytes`: the whole model's KV bytes per token; `context_len`: the longest
    sequence served (`--max-context-len` or the model's)."""
    if not needs_resolving(args):
        return args
    tp = max(int(getattr(args, "tensor_parallel_size", 1) or 1), 1)
    sized = memory_defaults(gpu_bytes, tp)
    changes: dict[str, int] = {}
    if args.chunked_prefill_size == 0:
        changes["chunked_prefill_size"] = sized.chunked_prefill_size
    if args.cuda_graph_max_bs == 0:
        changes["cuda_graph_max_bs"] = sized.cuda_graph_max_bs
    if args.max_running_requests == 0:
        kv = estimated_kv_tokens(args, gpu_bytes, model_path, per_token_bytes)
        changes["max_running_requests"] = running_requests(kv, context_len)
    logger.info(
        "GPU defaults for %.0f GiB (tp %d): %s",
        gpu_bytes / GIB, tp, ", ".join(f"{k}={v}" for k, v in changes.items()),
    )  # fmt: skip
    return dataclasses.replace(args, **changes)


def resolve_for_model(args: Any, model_path: Path) -> Any:
    """`resolve_gpu_defaults` for this process's CUDA device and the model folder."""
    if not needs_resolving(args) or not str(args.resolved_device).startswith("cuda"):
        return args
    import torch

    from sluice.runtime.engine.cpu_features import choose_dtype, choose_kv_dtype
    from sluice.runtime.memory.kv_buffers import bytes_per_token
    from sluice.runtime.model.registry import read_model_config

    config = read_model_config(model_path)
    dtype = choose_dtype(args.dtype, args.resolved_device).dtype
    kv_dtype = choose_kv_dtype(args.kv_cache_dtype, dtype)
    per_token = bytes_per_token(config.num_hidden_layers, config.num_key_value_heads,
                                config.head_dim, kv_dtype)  # fmt: skip
    context = args.max_context_len or config.context_length
    gpu_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    return resolve_gpu_defaults(args, gpu_bytes, model_path, per_token, context)
