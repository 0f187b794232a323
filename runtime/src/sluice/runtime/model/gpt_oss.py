"""gpt-oss (`GptOssForCausalLM`) over a paged KV cache, per transformers' `modeling_gpt_oss`.

- Attention with biases on q/k/v/o, a learned sink logit per head in every softmax, and
  sliding-window layers alternating with full ones (`config.layer_types`): each layer's
  `LayerAttention` carries its window and its sinks to the attention backend.
- YaRN RoPE (`model.rotary`: the inverse frequencies and the cos/sin attention factor).
- A top-k mixture of experts: a router with a bias, softmax over the k chosen logits, and
  experts with biases whose SwiGLU is clamped (`gate <= limit`, `-limit <= up <= limit`,
  `(up + 1) * gate * sigmoid(alpha * gate)`), gate and up interleaved in one matrix.
- MXFP4 expert weights (the released checkpoints' `*_blocks` / `*_scales` pairs: two FP4
  values a byte, one power-of-two scale per 32) are dequantized at load to the model's dtype.

The experts run as the other MoE layers' do: the (token, choice) pairs sorted by expert,
then two grouped GEMMs (`torch._grouped_mm`) with the experts' biases, no host sync; one
GEMM per active expert where `_grouped_mm` lacks the dtype. Tensor parallelism is refused
(expert sharding is not built).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

from sluice.runtime.attention.base import AttentionBackend
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.attention_block import Attention
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.config import ModelConfig, MoEOptions, SwiGLUClamp
from sluice.runtime.model.layers import Linear
from sluice.runtime.model.llama import attention_rules, common_rules
from sluice.runtime.model.moe import grouped_mm_supports
from sluice.runtime.model.moe_routing import ExpertOrder

_MXFP4 = re.compile(r"^(.+)_(blocks|scales)$")
# the FP4 (e2m1) code points, by their 4-bit index
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`[experts, rows, groups, 16]` uint8 blocks (low nibble first) and `[experts, rows,
    groups]` uint8 exponents (bias 127) -> `[experts, groups * 32, rows]` (the layout of the
    unquantized checkpoints: input features first)."""
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} differ")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)  # indexed on it
    blocks = blocks.to(torch.uint8)
    values = torch.stack([lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]], dim=-1)
    values = values.flatten(-2)  # [experts, rows, groups, 32]
    values = torch.ldexp(values, scales.to(torch.int32)[..., None] - 127)
    return values.flatten(-2).transpose(1, 2).contiguous().to(dtype)


class GptOssRMSNorm(nn.Module):
    """`weight * (x / rms(x))` in fp32, rounded once to the input's dtype."""

    def __init__(self, dim: int, eps: float, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(x.dtype)


class GptOssExperts(nn.Module):
    """The router and the clamped-SwiGLU experts of one layer (see the module docstring)."""

    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        moe = config.moe
        if moe is None or moe.clamp is None:
            raise ValueError("gpt-oss experts need the config's MoE options and SwiGLU clamp")
        experts, self.top_k = moe.num_experts, moe.top_k
        self.alpha, self.limit = moe.clamp.alpha, moe.clamp.limit
        hidden, inter = config.hidden_size, moe.intermediate_size
        self.router = Linear(hidden, experts, True, device, dtype)

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)

        self.gate_up_proj = param(experts, hidden, 2 * inter)  # gate, up interleaved by column
        self.gate_up_proj_bias = param(experts, 2 * inter)
        self.down_proj = param(experts, inter, hidden)
        self.down_proj_bias = param(experts, hidden)
        self._grouped: bool | None = None  # whether _grouped_mm runs the dtype (tried once)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The (token, choice) pairs sorted by expert (`ExpertOrder`), each expert's rows one
        segment of two grouped GEMMs (`torch._grouped_mm`, one call each, no host sync:
        CUDA-graph safe), or one GEMM per active expert where `_grouped_mm` lacks the dtype."""
        top_logits, chosen = torch.topk(self.router(x), self.top_k, dim=-1)
        weights = torch.softmax(top_logits, dim=-1)
        order = ExpertOrder(weights, chosen, self.gate_up_proj.shape[0])
        rows = x[order.rows]
        if self._grouped is None:
            self._grouped = grouped_mm_supports(x.dtype, x.device)
        if self._grouped:
            h = torch._grouped_mm(rows, self.gate_up_proj, offs=order.offsets)
            h = h + self.gate_up_proj_bias[order.experts]
            y = torch._grouped_mm(self._glu(h), self.down_proj, offs=order.offsets)
            y = y + self.down_proj_bias[order.experts]
        else:
            y = torch.empty_like(rows)
            for e, start, end in order.active():
                h = rows[start:end] @ self.gate_up_proj[e] + self.gate_up_proj_bias[e]
                y[start:end] = self._glu(h) @ self.down_proj[e] + self.down_proj_bias[e]
        return order.combine(y, x.shape[0])

    def _glu(self, h: torch.Tensor) -> torch.Tensor:
        """gpt-oss's clamped SwiGLU over gate and up interleaved by column."""
        gate = h[..., ::2].clamp(max=self.limit)
        up = h[..., 1::2].clamp(-self.limit, self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


class GptOssDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        tp: TensorParallelGroup = SINGLE_RANK,
    ):
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = GptOssRMSNorm(config.hidden_size, eps, device, dtype)
        self.self_attn = Attention(config, layer_id, device, dtype, sinks=True)
        self.post_attention_layernorm = GptOssRMSNorm(config.hidden_size, eps, device, dtype)
        self.mlp = GptOssExperts(config, device, dtype)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:  # fmt: skip
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))


class GptOssForCausalLM(CausalLM):
    """gpt-oss: `CausalLM` (its rule-driven loading) with gpt-oss's final norm and MXFP4
    expert weights dequantized as they stream in."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallelGroup = SINGLE_RANK,
        *,
        architecture: Architecture,
    ) -> None:
        if tp.size > 1:
            raise ValueError("gpt-oss with tensor parallelism is not supported (expert sharding "
                             "is not built); use --tensor-parallel-size 1")  # fmt: skip
        super().__init__(config, attn_backend, device, dtype, tp, architecture=architecture)
        self.dtype = dtype
        self.norm = GptOssRMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
    ) -> None:
        """`CausalLM.load_weights`, each MXFP4 `*_blocks` / `*_scales` pair dequantized into
        the tensor it stands for."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        super().load_weights(self._dequantized(items))

    def _dequantized(
        self, items: Iterable[tuple[str, torch.Tensor]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        halves: dict[str, dict[str, torch.Tensor]] = {}
        for name, tensor in items:
            packed = _MXFP4.match(name)
            if packed is None:
                yield name, tensor
                continue
            pair = halves.setdefault(packed.group(1), {})
            pair[packed.group(2)] = tensor
            if len(pair) == 2:
                del halves[packed.group(1)]
                yield packed.group(1), dequantize_mxfp4(pair["blocks"], pair["scales"], self.dtype)
        if halves:
            raise ValueError(f"MXFP4 tensors without their other half: {', '.join(sorted(halves))}")


def _read_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    if config.hidden_act != "silu":
        raise ValueError(f"gpt-oss experts are SwiGLU (silu), not {config.hidden_act!r}")
    moe = MoEOptions(
        num_experts=int(raw.get("num_local_experts") or raw["num_experts"]),
        top_k=int(raw.get("num_experts_per_tok", 4)),
        intermediate_size=config.intermediate_size,
        renormalize=True,  # a softmax over the chosen logits
        sparse_layers=tuple(range(config.num_hidden_layers)),
        clamp=SwiGLUClamp(float(raw.get("swiglu_alpha", 1.702)), float(raw.get("swiglu_limit", 7.0))),
    )  # fmt: skip
    # transformers scales by `head_dim ** -0.5`, a bit away from `1 / sqrt(head_dim)` for some
    return {"moe": moe, "attention_scale": config.head_dim**-0.5}


def _literal(hf: str, target: str) -> WeightRule:
    return WeightRule.literal(f"model.layers.{{layer}}.{hf}", f"layers.{{layer}}.{target}")


GPT_OSS_RULES = (
    common_rules()
    + attention_rules()
    + (
        _literal("self_attn.sinks", "self_attn.sinks"),
        _literal("mlp.router.weight", "mlp.router.weight"),
        _literal("mlp.router.bias", "mlp.router.bias"),
        *(_literal(f"mlp.experts.{p}", f"mlp.{p}") for p in ("gate_up_proj", "gate_up_proj_bias",
                                                              "down_proj", "down_proj_bias")),
    )  # fmt: skip
)

ARCHITECTURES = (
    Architecture(
        names=("GptOssForCausalLM",),
        model_types=("gpt_oss",),
        decoder_layer=GptOssDecoderLayer,
        weight_rules=GPT_OSS_RULES,
        model_class=GptOssForCausalLM,
        read_options=_read_options,
    ),
)
