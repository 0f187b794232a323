"""Choose an attention backend by name (`--attention-backend`).

`auto` picks by device: on CUDA, `flashinfer` when the package imports, else `triton`,
else `torch` (and for a model FlashInfer cannot run, windowed or soft-capped or with
sinks, `triton`: `auto_fallback_name`, with one warning); on the CPU, `cpu` (the in-place paged kernels, or their torch fallback
when the extension cannot be built). An explicit name that cannot run where it is asked to
(`flashinfer` on the CPU, a package that is not installed, `triton` on the CPU without
Triton's interpreter) is refused with one line saying why: `sluice serve` checks it while
parsing its flags and exits 2.
"""

from __future__ import annotations

import functools
import importlib
import logging

import torch

from sluice.runtime import constants
from sluice.runtime.attention.availability import backend_problem, is_cuda
from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.attention.cpu_backend import CpuAttentionBackend
from sluice.runtime.attention.torch_backend import TorchAttentionBackend

logger = logging.getLogger("sluice.attention")


@functools.cache
def _imports(module: str) -> bool:
    """Whether `module` imports here (a broken install counts as missing)."""
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - any failure means the backend cannot be used
        logger.debug("%s does not import: %s", module, err)
        return False
    return True


def resolve_backend_name(name: str, device: str | torch.device) -> str:
    """The concrete backend `name` stands for on `device` (`auto` picks by device)."""
    if name not in constants.ATTENTION_BACKENDS:
        raise ValueError(
            f"unknown attention backend {name!r}; "
            f"choose one of {', '.join(constants.ATTENTION_BACKENDS)}"
        )
    if name != "auto":
        return name
    if is_cuda(device):
        if _imports("flashinfer"):
            return "flashinfer"
        if _imports("triton"):
            return "triton"
        return "torch"
    # the CPU gets its in-place paged kernels (a compiled extension, or their torch fallback)
    return "cpu" if torch.device(device).type == "cpu" else "torch"


def auto_fallback_name(name: str, device: str | torch.device) -> str | None:
    """What `auto` falls back to when the backend it chose cannot run a model's attention
    (FlashInfer: one plan serves all layers, so no per-layer windows, sinks or soft-caps):
    Triton on CUDA (torch without it); None when there is nothing to fall back from."""
    if name != "auto" or resolve_backend_name(name, device) != "flashinfer":
        return None
    return "triton" if _imports("triton") else "torch"


def create_attention_backend(
    name: str,
    device: str | torch.device,
    *,
    scale: float | None = None,
    page_size: int = 1,
    log_choice: bool = True,
) -> AttentionBackend:
    """Build the backend `name` for `device`; `scale` defaults to `1 / sqrt(head_dim)`.
    `page_size` is the KV pool's (FlashInfer reads the cache page by page)."""
    resolved = resolve_backend_name(name, device)
    problem = backend_problem(resolved, device)
    if problem is not None:
        raise ValueError(problem)
    if log_choice:
        why = f"auto on {device}" if name == "auto" else "asked for"
        logger.info("attention backend: %s (%s)", resolved, why)
    if resolved == "triton":
        from sluice.runtime.attention.triton.backend import TritonAttentionBackend
        from sluice.runtime.attention.triton.config import TritonAttentionConfig

        return TritonAttentionBackend(scale, TritonAttentionConfig.for_device(str(device)))
    if resolved == "flashinfer":
        from sluice.runtime.attention.flashinfer import FlashInferAttentionBackend

        return FlashInferAttentionBackend(scale, page_size=page_size, device=device)
    if resolved == "cpu":
        return CpuAttentionBackend(scale=scale)
    return TorchAttentionBackend(scale=scale)


def create_model_backend(name: str, device: str | torch.device, *, page_size: int = 1) -> AttentionBackend:
    """The backend a model runs with: two instances of `name` behind `SplitBatchAttention`,
    so the decode rows of a mixed batch take the decode kernels (the choice is logged once)."""
    from sluice.runtime.attention.split import SplitBatchAttention

    return SplitBatchAttention(
        create_attention_backend(name, device, page_size=page_size),
        create_attention_backend(name, device, page_size=page_size, log_choice=False),
    )
