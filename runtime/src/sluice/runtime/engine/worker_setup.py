"""The model worker's set-up, apart from its per-forward path (`model_worker.py`): how many
torch threads, which attention backend, and how big the KV pool and the context are."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.batch_invariant import BatchInvariantAttentionBackend
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend
from sluice.runtime.attention.registry import auto_fallback_name, create_model_backend
from sluice.runtime.distributed.group import TensorParallelGroup
from sluice.runtime.engine.config import EngineConfig
from sluice.runtime.kernels import cpu_extension
from sluice.runtime.memory.window_pages import window_pool_floor
from sluice.runtime.threads import model_worker_threads

logger = logging.getLogger("sluice.model_worker")


def set_torch_threads(args: EngineConfig, device: str, tp: TensorParallelGroup) -> None:
    """The flag's thread count, else the machine's cores (shared by the ranks on the host)."""
    if device == "cpu" or args.torch_threads > 0:
        threads, why = model_worker_threads(args.torch_threads, torch.get_num_threads())
        if tp.local_size > 1 and args.torch_threads <= 0:  # the ranks share the cores
            threads, why = max(1, threads // tp.local_size), f"{why}, over {tp.local_size} ranks"
        torch.set_num_threads(threads)
        logger.info("model worker: %d torch threads (%s)", threads, why)


def size_kv_pool(args: EngineConfig, device: str, per_token_bytes: int, ranks_on_host: int = 1) -> int:
    """KV pool size in tokens: the flag, else the CPU budget (shared by the tensor-parallel
    ranks on the host), else the GPU memory fraction (of this rank's GPU)."""
    if args.max_total_tokens > 0:
        return args.max_total_tokens
    if device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info()
        return gpu_kv_pool_tokens(total, free, args.mem_fraction_static, per_token_bytes)
    return int(args.cpu_kv_cache_gib * 2**30 / ranks_on_host // per_token_bytes)


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


@dataclass(frozen=True)
class PoolLayout:
    """The sizes the scheduler's bookkeeping must agree with."""

    total_tokens: int  # usable KV tokens (whole pages)
    page_size: int
    rows: int  # request rows (max running requests)
    context_len: int  # longest sequence served
    model_context_len: int  # the model's own limit (before the pool clipped it)
    window_tokens: int = 0  # the sliding layers' own pool (`window_pages`); 0: none
    window: int = 0  # their window, in tokens
    window_holds_all: bool = False  # every layer slides: the full pool holds no K/V


def row_invariant_kernels(device: str, dtype: torch.dtype) -> bool:
    """Whether the default path is already batch-invariant: bf16 on the CPU runs the compiled
    linear and attention kernels, in which a token's every sum has one order whatever else
    its forward holds (`kernels/csrc/linear.cpp`, `paged_attention.cpp`)."""
    return device == "cpu" and dtype == torch.bfloat16


def fallback_backend(args: EngineConfig, device: str) -> Callable[[], AttentionBackend] | None:
    """The backend to build instead when the one `auto` chose cannot run the model."""
    name = auto_fallback_name(args.attention_backend, device)
    if name is None or args.enable_deterministic_inference:
        return None
    return lambda: create_model_backend(name, device, page_size=args.page_size)


def attention_backend(args: EngineConfig, device: str, dtype: torch.dtype) -> AttentionBackend:
    if not args.enable_deterministic_inference:
        return create_model_backend(args.attention_backend, device, page_size=args.page_size)
    if not row_invariant_kernels(device, dtype):
        return BatchInvariantAttentionBackend()
    if (reason := cpu_extension.load()) is not None:  # the linear kernel needs them too
        raise RuntimeError(
            f"--enable-deterministic-inference in bf16 on the CPU needs the compiled CPU "
            f"kernels ({reason}); or run --dtype float32"
        )
    return CpuAttentionBackend(use_kernels=True)


@dataclass(frozen=True)
class SlidingLayers:
    """A model's sliding-window layers, as its KV pools see them (`full_bytes` 0: every
    layer slides)."""

    window: int
    layers: tuple[int, ...]  # the sliding layers' ids
    full_bytes: int  # K plus V of one token in the full layers
    window_bytes: int  # ... in the sliding layers


def split_window_pool(args: EngineConfig, tokens: int, sliding: SlidingLayers) -> tuple[int, int]:
    """(full pool, window pool) in tokens, from the pool of `tokens` every layer would have.

    `--max-total-tokens` sizes the full pool itself; otherwise both share that pool's bytes.
    The window pool gets `--swa-full-tokens-ratio` of the full pool's tokens or, at 0, what
    the running requests' windows and one prefill batch can ever need (`window_pool_floor`);
    never more than the full pool, and never less than that need (or the full pool)."""
    page, ratio = args.page_size, args.swa_full_tokens_ratio
    floor = window_pool_floor(
        args.max_running_requests, sliding.window, page, args.max_prefill_tokens
    )
    if args.max_total_tokens > 0:
        full = tokens
        window = int(ratio * full) if ratio > 0 else floor
    else:
        budget = tokens * (sliding.full_bytes + sliding.window_bytes)
        if ratio > 0:
            full = int(budget // (sliding.full_bytes + ratio * sliding.window_bytes))
            window = int(ratio * full)
        else:
            window = min(floor, tokens)
            full = (budget - window * sliding.window_bytes) // sliding.full_bytes
    full = full // page * page
    window = min(window, full) // page * page
    if window < min(floor, full):
        raise ValueError(
            f"--swa-full-tokens-ratio {ratio} gives the sliding-window layers {window} KV "
            f"tokens; {args.max_running_requests} running requests' windows of "
            f"{sliding.window} and one prefill batch need {min(floor, full)}: raise the ratio "
            f"(or 0: sized from the model), or lower --max-running-requests"
        )
    return full, window


# the full pool's pages when every layer slides: keys only (no K/V), so sized to what the
# running requests can hold, up to this many tokens of host bookkeeping
KEY_ONLY_FULL_POOL_MAX_TOKENS = 1 << 20


def split_pools(
    args: EngineConfig, tokens: int, sliding: SlidingLayers, model_context: int
) -> tuple[int, int]:
    """(full pool, window pool) in tokens, from the pool of `tokens` every layer would have;
    a window pool of 0: one pool, as without `sliding`."""
    if sliding.full_bytes:
        return split_window_pool(args, tokens, sliding)
    return every_layer_slides(args, tokens, sliding, model_context)


def every_layer_slides(
    args: EngineConfig, tokens: int, sliding: SlidingLayers, model_context: int
) -> tuple[int, int]:
    """(full pool, window pool) when every layer slides (Mistral 7B v0.1, Qwen2 with
    `use_sliding_window`): the window pool holds all the K/V, `tokens` of it (the flag or
    the memory budget); the full pool holds none, its pages are only the keys of the
    holdings, the radix cache and `req_to_token`, as many as the running requests can hold
    at the longest context. One pool (0) when the budget is below what the running
    requests' windows and one prefill batch can need (`window_pool_floor`): a window pool
    that can run short would stall a prompt longer than what it has free."""
    if args.swa_full_tokens_ratio > 0:
        raise ValueError(
            "--swa-full-tokens-ratio sizes the sliding layers' pool against the full layers'; "
            "every layer of this model slides, so its window pool is its whole KV pool (size "
            "it with --max-total-tokens or the memory flags)"
        )
    page = args.page_size
    floor = window_pool_floor(
        args.max_running_requests, sliding.window, page, args.max_prefill_tokens
    )
    window = tokens // page * page
    if window < floor:
        logger.warning(
            "every layer slides (window %d), but a KV pool of %d tokens is below what %d "
            "running requests' windows and one prefill batch need (%d): one pool keeps "
            "every token (raise the KV budget or lower --max-running-requests to keep only "
            "the windows)",
            sliding.window, window, args.max_running_requests, floor,
        )  # fmt: skip
        return tokens, 0
    context = args.max_context_len or model_context
    keys = min(args.max_running_requests * (context + page), KEY_ONLY_FULL_POOL_MAX_TOKENS)
    return max(keys, window) // page * page, window


def pool_layout(
    args: EngineConfig,
    model_context: int,
    per_token_bytes: int,
    device: str,
    tp: TensorParallelGroup,
    sliding: SlidingLayers | None = None,
) -> PoolLayout:
    """The KV pool (the same on every rank: the smallest any rank can hold) and the longest
    sequence served in it; with `sliding`, the full and the window pool."""
    total = tp.min_over_ranks(size_kv_pool(args, device, per_token_bytes, tp.local_size))
    window_tokens = 0
    if sliding is not None:
        total, window_tokens = split_pools(args, total, sliding, model_context)
    layout = layout_of(args, total, window_tokens, sliding, model_context)
    if window_tokens and sliding is not None:
        logger.info(
            "sliding-window layers (%d, window %d) keep only their window: KV pools of %d "
            "tokens (full layers%s) and %d (sliding layers)",
            len(sliding.layers), sliding.window, layout.total_tokens,
            ": page keys only, no K/V" if layout.window_holds_all else "", window_tokens,
        )  # fmt: skip
    if layout.context_len < layout.model_context_len:
        logger.warning(
            "context length clipped to %d tokens (the model allows %d): the KV pool holds %d "
            "tokens and one request must fit it alone; raise --max-total-tokens (or "
            "--cpu-kv-cache-gib / --mem-fraction-static) to serve longer sequences",
            layout.context_len, layout.model_context_len, layout.total_tokens,
        )  # fmt: skip
    return layout


def layout_of(
    args: EngineConfig,
    total: int,
    window_tokens: int,
    sliding: SlidingLayers | None,
    model_context: int,
) -> PoolLayout:
    """A full pool of `total` tokens and a window pool of `window_tokens` (0: none), in whole
    pages, and the longest sequence served in them: one request alone must always fit the
    full pool, so retraction can always make progress (`sluice simulate` lays out its
    replicas' pools here too)."""
    page = args.page_size
    total = total // page * page
    model_context = args.max_context_len or model_context
    context = min(model_context, total - page)
    if context < 2:
        raise ValueError(f"KV pool of {total} tokens is too small (page size {page})")
    window = sliding.window if window_tokens and sliding is not None else 0
    holds_all = bool(window) and sliding is not None and not sliding.full_bytes
    return PoolLayout(
        total, page, args.max_running_requests, context, model_context, window_tokens,
        window, holds_all,
    )  # fmt: skip
