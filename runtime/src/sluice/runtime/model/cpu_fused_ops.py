"""Switch a model's RMSNorm, rotary embedding, SiLU-and-multiply, bf16 linear layers (and
w8a8's activation quantization and rescaling) to the compiled CPU ops. Call it after
quantizing.

Each is one pass over its rows instead of 3 to 12 torch ops with their temporaries; the ops
round where transformers' bf16 code rounds (see `kernels/csrc/fused_ops.cpp`), so bf16
results stay what the torch ops give, and fp32 results differ only by summation order.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.runtime.kernels import cpu_extension
from sluice.runtime.model.attention_block import Attention
from sluice.runtime.model.layers import Linear, RMSNorm, SwiGLUMLP
from sluice.runtime.model.moe import MoE
from sluice.runtime.model.quantization import W8A8Linear


def enable(model: nn.Module) -> str | None:
    """Turn the fused ops on for every layer; None when on, else why they are not."""
    dtype = next(model.parameters()).dtype
    if dtype not in (torch.float32, torch.bfloat16):
        return f"no fused ops for {dtype}"
    reason = cpu_extension.load()
    if reason is not None:
        return reason
    for module in model.modules():
        if isinstance(module, (Linear, RMSNorm, SwiGLUMLP, Attention, W8A8Linear, MoE)):
            module.fused = True
    return None
