"""Which engine faults the server survives.

A forward (or the sampling after it) that raises loses its batch: the scheduler ends that
batch's requests with an error and goes on serving. Some faults leave the device unusable
instead: after a CUDA error (an illegal memory access, a device-side assert, a failed
collective) every later kernel fails or, worse, computes garbage. Those take the server
down, and every client is answered before it exits.
"""

from __future__ import annotations

import torch

# what CUDA, cuBLAS, cuDNN and NCCL errors say when torch raises them as a plain RuntimeError
_UNRECOVERABLE_TEXT = (
    "CUDA error",
    "CUBLAS_STATUS",
    "CUDNN_STATUS",
    "cuDNN error",
    "NCCL error",
    "device-side assert",
    "illegal memory access",
)


class EngineUnusable(RuntimeError):
    """A fault after which the engine's device state cannot be trusted."""


def is_unrecoverable(exc: BaseException) -> bool:
    """Whether `exc`, raised by a forward, leaves the engine unusable. An out-of-memory
    error is not: the batch is lost, the allocator is intact."""
    if isinstance(exc, EngineUnusable):
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    if isinstance(exc, torch.OutOfMemoryError):
        return False
    text = str(exc)
    return any(marker in text for marker in _UNRECOVERABLE_TEXT)
