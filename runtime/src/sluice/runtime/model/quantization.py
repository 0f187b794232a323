"""`--quantization w8a8`: int8 weights (per output channel) and int8 activations (per token);
`--quantization w8a16`: int8 weights (a scale per output row and group of 32 inputs) with bf16
activations.

The scheme is torchao's `Int8DynamicActivationInt8WeightConfig`: weights are quantized once
by torchao itself (`Int8Tensor.from_hp`, symmetric, one fp32 scale per output row);
activations are quantized symmetrically per token at each call; the product runs in
torch's int8 GEMM (`torch._int_mm`, oneDNN with VNNI) and is rescaled by both scales.
torchao's own linear dispatch computes exactly this, but through several Python layers
per call (about 1 ms for a 16-row decode GEMM on a 2-core CPU, 20x the GEMM itself), so
`W8A8Linear` calls the same primitives directly (with the fused CPU ops, the activation
quantization and the rescaling are one compiled pass each around torch's GEMM);
`tests/model/test_cpu_fast_path.py` checks it against torchao's quantized `nn.Linear`.

w8a16 keeps the activations in bf16 and stores the weights in int8, symmetric, with one fp32
scale per output row and group of 32 inputs (max |w| / 127; one scale per row was measured
too lossy on SmolLM2: 7 of 16 served answers kept against bf16's 12). The weights are packed
at load in the AMX tiles the kernel reads (`sluice_cpu.pack_w8`); the compiled AMX linear
(`kernels/csrc/linear.cpp`, `linear_w8`) widens each weight to bf16(w8 * scale) as it reads
it, so it computes exactly what the bf16 path computes on those widened weights, from 9/16
of the bytes. Layers whose input width is not a multiple of 32 stay in bf16. It needs a CPU
with AMX-BF16 and `--dtype bfloat16`.

The output projection (`lm_head`) stays in the model dtype: for w8a8 quantizing the logits
costs the most quality; for w8a16 it kept the quality but was measured to save too little
(benchmarks/README.md) to hold a second, int8 copy of a tied embedding.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.runtime.constants import QUANTIZATIONS
from sluice.runtime.model.layers import Linear

INT8_MIN, INT8_MAX = -128.0, 127.0
# torchao's symmetric scale: max |x| spread over the whole int8 range, (127 - -128) / 2
SYMMETRIC_HALF_RANGE = (INT8_MAX - INT8_MIN) / 2
_EPS = torch.finfo(torch.float32).eps  # torchao's eps for the scales


def torchao_available() -> bool:
    try:
        import torchao  # noqa: F401
    except ImportError:
        return False
    return True


class W8A8Linear(nn.Module):
    """`y = x @ W.T + b` with `W` int8 per output channel and `x` int8 per token."""

    def __init__(
        self, qweight_t: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
    ):
        super().__init__()
        self.register_buffer("qweight_t", qweight_t)  # [in, out] int8 (a transposed view)
        self.register_buffer("weight_scale", weight_scale)  # [out] fp32
        self.bias = bias
        self.fused = False  # quantize and rescale in one compiled pass each (cpu_fused_ops)

    @classmethod
    def from_linear(cls, linear: Linear) -> W8A8Linear:
        from torchao.quantization.granularity import PerRow
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

        quantized = Int8Tensor.from_hp(linear.weight.detach().float(), PerRow())
        qweight = quantized.qdata.contiguous()  # [out, in]
        scale = quantized.scale.reshape(-1).float()
        return cls(qweight.t(), scale, linear.bias)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> W8A8Linear:
        """From a `[out, in]` weight (an MoE expert's projection)."""
        from torchao.quantization.granularity import PerRow
        from torchao.quantization.quantize_.workflows.int8.int8_tensor import Int8Tensor

        quantized = Int8Tensor.from_hp(weight.detach().float(), PerRow())
        return cls(quantized.qdata.contiguous().t(), quantized.scale.reshape(-1).float(), bias)

    @property
    def in_features(self) -> int:
        return int(self.qweight_t.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if self.fused:
            xq, scale = torch.ops.sluice_cpu.quantize_per_token(rows)
            acc = torch._int_mm(xq, self.qweight_t)
            bias = None if self.bias is None else self.bias.to(x.dtype).contiguous()
            y = torch.ops.sluice_cpu.rescale_int_mm(acc, scale, self.weight_scale, bias, x.dtype)
            return y.reshape(*shape[:-1], y.shape[-1])
        x32 = rows.float()
        scale = (x32.abs().amax(dim=-1, keepdim=True) / SYMMETRIC_HALF_RANGE).clamp_(min=_EPS)
        xq = torch.round(x32 / scale).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
        y = torch._int_mm(xq, self.qweight_t).float().mul_(scale).mul_(self.weight_scale)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*shape[:-1], y.shape[-1])


W8A16_GROUP = 32  # inputs per scale: the kernel's widening step


class W8A16Linear(nn.Module):
    """`y = x @ bf16(W8 * scale).T + b`, `W8` int8 with a scale per row and group of 32, both
    held in the AMX tile order the kernel reads (`sluice_cpu.pack_w8`)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        """`weight` int8 `[out, in]`, `scale` fp32 `[out, in / 32]`."""
        super().__init__()
        self.out_features = int(weight.shape[0])
        packed_weight, packed_scale = torch.ops.sluice_cpu.pack_w8(weight, scale)
        self.register_buffer("weight8", packed_weight)  # [ceil(out / 16), in / 32, 16, 32]
        self.register_buffer("weight_scale", packed_scale)  # [ceil(out / 16), in / 32, 16]
        self.bias = bias

    @classmethod
    def from_linear(cls, linear: Linear) -> W8A16Linear:
        weight = linear.weight.detach().float()
        rows, cols = weight.shape
        groups = weight.reshape(rows, cols // W8A16_GROUP, W8A16_GROUP)
        scale = (groups.abs().amax(dim=-1) / INT8_MAX).clamp_(min=_EPS)
        q = torch.round(groups / scale[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
        return cls(q.reshape(rows, cols).contiguous(), scale.contiguous(), linear.bias)

    @property
    def in_features(self) -> int:
        return int(self.weight8.shape[1] * W8A16_GROUP)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        y = torch.ops.sluice_cpu.linear_w8(
            rows, self.weight8, self.weight_scale, self.out_features, self.bias, x.dtype
        )
        return y.reshape(*shape[:-1], y.shape[-1])


def w8a16_problem(dtype: torch.dtype) -> str | None:
    """Why `--quantization w8a16` cannot run here (None: it can)."""
    from sluice.runtime.kernels import cpu_extension

    if dtype != torch.bfloat16:
        return f"--quantization w8a16 needs --dtype bfloat16 (the model runs in {dtype})"
    if (reason := cpu_extension.load()) is not None:
        return f"--quantization w8a16 needs the compiled CPU kernels ({reason})"
    if AMX_PATH not in torch.ops.sluice_cpu.linear_paths():
        return (
            "--quantization w8a16 needs a CPU with AMX-BF16 (its int8 weights run on the amx path)"
        )
    return None


AMX_PATH = 2  # linear.cpp's path ids: avx2 0, avx512bf16 1, amx 2


def quantize_w8a16(model: nn.Module) -> int:
    """Every `Linear` of the decoder layers' attention and dense MLPs whose input width is a
    multiple of 32 (an MoE layer's experts keep the model dtype)."""
    dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
    if (problem := w8a16_problem(dtype)) is not None:
        raise RuntimeError(problem)
    count = 0
    for layer in model.layers:
        for parent in (layer.self_attn, layer.mlp):
            if hasattr(parent, "quantize_w8a8"):  # an MoE layer
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, Linear) and child.weight.shape[1] % W8A16_GROUP == 0:
                    setattr(parent, name, W8A16Linear.from_linear(child))
                    count += 1
    return count


def quantize_model(model: nn.Module, method: str) -> int:
    """Replace every `Linear` of the decoder layers by its quantized form; returns how many.
    `lm_head` (and the embedding) keep the model dtype."""
    if method == "none":
        return 0
    if method == "w8a16":
        return quantize_w8a16(model)
    if method != "w8a8":
        raise ValueError(
            f"unknown quantization {method!r}; choose one of {', '.join(QUANTIZATIONS)}"
        )
    if not torchao_available():
        raise RuntimeError("--quantization w8a8 needs torchao: pip install torchao")
    count = 0
    for layer in model.layers:
        if hasattr(layer.mlp, "quantize_w8a8"):  # an MoE layer: its experts, not its router
            count += layer.mlp.quantize_w8a8()
        for parent in (layer.self_attn, layer.mlp):
            if hasattr(parent, "quantize_w8a8"):
                continue
            for name, child in list(parent.named_children()):
                if isinstance(child, Linear):
                    setattr(parent, name, W8A8Linear.from_linear(child))
                    count += 1
    return count
