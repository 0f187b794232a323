"""Building blocks of the Llama family: a plain linear layer, RMSNorm, SwiGLU MLP.

Parameters are allocated uninitialised (`torch.empty`) directly on the target device and
dtype: every one of them is overwritten by `load_weights`, so random init is wasted work.

With `fused` set (`model.cpu_fused_ops.enable`), RMSNorm and SiLU-and-multiply run as one
compiled CPU op each (`torch.ops.sluice_cpu.*`) instead of a chain of torch ops, and bf16
linear layers run `sluice_cpu.linear`, whose every output sums K in one fixed order whatever
the row count (`kernels/csrc/linear.cpp`): a token's result does not depend on what shares
its forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# fp32 logits without the kernel: the weight converted this many rows at a time, so no fp32
# copy of a whole (vocabulary-sized) matrix is ever made
_FP32_SLICE_ROWS = 4096


class Linear(nn.Module):
    """`y = x @ W.T + b`; the weight may be several HF projections stacked by rows."""

    fused = False  # bf16 on the CPU: the row-invariant compiled kernel (cpu_fused_ops)
    batch_invariant = False  # CUDA, deterministic mode: the Triton kernel (batch_invariant_ops)

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.empty(out_features, device=device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._apply(x, x.dtype)

    def forward_fp32(self, x: torch.Tensor) -> torch.Tensor:
        """`x @ W.T + b` summed and returned in fp32 from weights of any dtype (the LM head:
        bf16 logits tie values one bf16 step apart). Never makes an fp32 copy of the weight."""
        return self._apply(x, torch.float32)

    def _apply(self, x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
        if self.fused and x.dtype == torch.bfloat16 == self.weight.dtype:
            rows = x.reshape(-1, x.shape[-1])
            out = torch.ops.sluice_cpu.linear(rows, self.weight, self.bias, out_dtype)
            return out.view(*x.shape[:-1], out.shape[-1])
        if self.batch_invariant:
            from sluice.runtime.kernels.triton_batch_invariant import matmul

            return matmul(x, self.weight, self.bias, out_dtype)
        if out_dtype == x.dtype:
            return F.linear(x, self.weight, self.bias)
        if self.weight.dtype == torch.float32:  # fp32 out of fp32 weights: upcast the rows
            return F.linear(x.float(), self.weight, self.bias)
        # fp32 out of bf16/fp16 weights
        if x.is_cuda:  # cuBLAS: bf16/fp16 inputs, fp32 accumulation and output
            out = torch.mm(x.reshape(-1, x.shape[-1]), self.weight.t(), out_dtype=out_dtype)
            out = out.view(*x.shape[:-1], -1)
        else:
            x32 = x.float()
            out = torch.cat([F.linear(x32, self.weight[i : i + _FP32_SLICE_ROWS].float())
                             for i in range(0, self.weight.shape[0], _FP32_SLICE_ROWS)], dim=-1)  # fmt: skip
        return out if self.bias is None else out + self.bias.float()

    def load_rows(self, kind: str, tensor: torch.Tensor, start: int) -> None:
        """Copy an HF projection's `weight` or `bias` into rows `[start, start + len)`."""
        target = self.weight if kind == "weight" else self.bias
        if target is None:
            raise ValueError("checkpoint has a bias this layer was configured without")
        rows = tensor.shape[0]
        if tensor.shape[1:] != target.shape[1:] or start + rows > target.shape[0]:
            raise ValueError(
                f"{kind} of shape {tuple(tensor.shape)} does not fit rows {start}..{start + rows} "
                f"of {tuple(target.shape)}"
            )
        target.data[start : start + rows].copy_(tensor)


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32, as HF's `LlamaRMSNorm`."""

    def __init__(
        self, hidden_size: int, eps: float, device: torch.device | str, dtype: torch.dtype
    ):
        super().__init__()
        self.eps = eps
        self.fused = False
        self.batch_invariant = False  # CUDA, deterministic mode: one Triton program per row
        self.weight = nn.Parameter(
            torch.empty(hidden_size, device=device, dtype=dtype), requires_grad=False
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.dim() == 2:
            return torch.ops.sluice_cpu.rms_norm(x, self.weight, self.eps)
        if self.batch_invariant and x.dim() == 2:
            from sluice.runtime.kernels.triton_fused import rms_norm

            return rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SwiGLUMLP(nn.Module):
    """`down(silu(gate(x)) * up(x))` with gate and up fused into one matmul."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        bias: bool,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.fused = False
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias, device, dtype)
        self.down_proj = Linear(intermediate_size, hidden_size, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.dim() == 2:
            return self.down_proj(torch.ops.sluice_cpu.silu_mul(self.gate_up_proj(x)))
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
