"""Gemma 2 and Gemma 3 (text) over a paged KV cache.

What sets them apart from the Llama family, all of it per transformers' `modeling_gemma2`
and `modeling_gemma3`:

- sliding-window and full-attention layers interleaved (`config.layer_types`: Gemma 2
  alternates, Gemma 3 has five local layers per global one), each layer's window, scale
  (`query_pre_attn_scalar ** -0.5`) and attention soft-cap (Gemma 2's
  `attn_logit_softcapping`) handed to the attention backend as its `LayerAttention`;
- two RoPE bases on Gemma 3 (`rope_local_base_freq` for the sliding layers, `rope_theta`
  with its scaling for the global ones);
- RMSNorm with a `(1 + weight)` gain computed in fp32; per-head RMSNorm of q and k on Gemma 3
  (QK-norm), before RoPE;
- four norms per layer: before and after attention, before and after the MLP;
- the embeddings multiplied by `sqrt(hidden_size)` (rounded to the weights' dtype);
- GeGLU: `down(gelu_tanh(gate(x)) * up(x))`;
- the final logits soft-capped (Gemma 2's `final_logit_softcapping`).

Tensor parallelism follows `LlamaShard` (the projection names are Llama's): each rank holds
its heads and MLP share, and the row-parallel outputs are all-reduced before the post-norms.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from sluice.runtime.attention.base import AttentionBackend, LayerAttention
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.distributed.layers import embed, gather_logits
from sluice.runtime.distributed.sharding import LlamaShard
from sluice.runtime.model.config import SLIDING, ModelConfig, RopeScaling
from sluice.runtime.model.forward_batch import ForwardBatch
from sluice.runtime.model.layers import Linear
from sluice.runtime.model.rotary import RotaryEmbedding

_LAYER_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_IGNORED_WEIGHTS = re.compile(r"rotary_emb\.\w*inv_freq$")
_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


class GemmaRMSNorm(nn.Module):
    """`x / rms(x) * (1 + weight)` in fp32, rounded once to the input's dtype (Gemma's order)."""

    def __init__(self, dim: int, eps: float, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


class GeGLUMLP(nn.Module):
    """`down(gelu_tanh(gate(x)) * up(x))` with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.intermediate_size = intermediate
        self.gate_up_proj = Linear(hidden, 2 * intermediate, False, device, dtype)
        self.down_proj = Linear(intermediate, hidden, False, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


def attention_options(config: ModelConfig, layer_id: int) -> LayerAttention:
    """Layer `layer_id`'s window, soft-cap and scale."""
    raw = config.raw
    scalar = raw.get("query_pre_attn_scalar") or config.head_dim
    softcap = raw.get("attn_logit_softcapping")
    return LayerAttention(
        window=config.window_for(layer_id),
        softcap=float(softcap) if softcap else None,
        scale=float(scalar) ** -0.5,
    )


class GemmaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_id: int, device: torch.device | str, dtype: torch.dtype
    ):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, device, dtype
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, config.o_bias, device, dtype)
        self.qk_norm = config.model_type.startswith("gemma3")
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)
            self.k_norm = GemmaRMSNorm(config.head_dim, config.rms_norm_eps, device, dtype)
        self.options = attention_options(config, layer_id)
        self.sliding = config.window_for(layer_id) is not None

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        n = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        out = backend.forward(q, k, v, self.layer_id, batch, self.options)
        return self.o_proj(out.reshape(n, self.q_size))


class GemmaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        tp: TensorParallelGroup,
    ):
        super().__init__()
        self.tp = tp
        eps, hidden = config.rms_norm_eps, config.hidden_size
        for name in _NORMS:
            setattr(self, name, GemmaRMSNorm(hidden, eps, device, dtype))
        self.self_attn = GemmaAttention(config, layer_id, device, dtype)
        self.mlp = GeGLUMLP(hidden, config.intermediate_size, device, dtype)

    def forward(
        self,
        x: torch.Tensor,
        ropes: Mapping[bool, tuple[torch.Tensor, torch.Tensor]],
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), ropes[self.self_attn.sliding], batch, backend)
        x = x + self.post_attention_layernorm(self.tp.all_reduce(attn))
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(self.tp.all_reduce(mlp))


class GemmaForCausalLM(nn.Module):
    """Gemma 2 / Gemma 3 text model: token ids in, next-token logits out (see the module
    docstring); the same interface as `LlamaForCausalLM`."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallelGroup = SINGLE_RANK,
    ) -> None:
        super().__init__()
        if config.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"Gemma's MLP is GeGLU (gelu_pytorch_tanh), not {config.hidden_act!r}")
        self.tp = tp
        self.shard = LlamaShard(config, tp.rank, tp.size)
        self.config = config
        self.local_config = local = self.shard.local_config()
        self.attn_backend = attn_backend
        self.embed_tokens = nn.Parameter(
            torch.empty(local.vocab_size, local.hidden_size, device=device, dtype=dtype),
            requires_grad=False,
        )
        # HF keeps the multiplier as a tensor cast to the weights' dtype
        self.embed_scale = float(torch.tensor(config.hidden_size**0.5, dtype=dtype))
        local_theta = config.rope_local_theta or config.rope_theta
        self.rotary = nn.ModuleDict({
            "full": RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling, device),
            "sliding": RotaryEmbedding(config.head_dim, local_theta, RopeScaling(), device),
        })  # fmt: skip
        self.layers = nn.ModuleList(
            GemmaDecoderLayer(local, i, device, dtype, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head = Linear(local.hidden_size, local.vocab_size, False, device, dtype)
        self.lm_head.weight = self.embed_tokens
        softcap = config.raw.get("final_logit_softcapping")
        self.final_softcap = float(softcap) if softcap else None
        self.uses_sliding = SLIDING in config.layer_types and config.sliding_window is not None

    @torch.no_grad()
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits at each request's last new token (every token with
        `batch.return_all_logits`; `batch.extra_logit_indices` rows after them)."""
        self.attn_backend.init_forward_metadata(batch)
        hidden = embed(batch.input_ids, self.embed_tokens, self.shard.vocab_start, self.tp)
        hidden = hidden * self.embed_scale
        ropes = {False: self.rotary["full"].cos_sin(batch.positions, hidden.dtype)}
        if self.uses_sliding:
            ropes[True] = self.rotary["sliding"].cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, ropes, batch, self.attn_backend)
        if not batch.return_all_logits:
            wanted = batch.last_token_indices
            if batch.extra_logit_indices is not None:
                wanted = torch.cat([wanted, batch.extra_logit_indices])
            hidden = hidden[wanted]
        rows = hidden.shape[0]
        if batch.row_multiple > 1:  # deterministic mode: a batch-invariant row count
            padded = max(batch.row_multiple, -(-rows // batch.row_multiple) * batch.row_multiple)
            hidden = torch.cat([hidden, hidden.new_zeros(padded - rows, hidden.shape[1])])
        logits = gather_logits(self.lm_head(self.norm(hidden)), self.config.vocab_size, self.tp)
        logits = logits[:rows].float()
        if self.final_softcap is not None:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
    ) -> None:
        """Copy Hugging Face-named tensors into the (fused) parameters; `ValueError` names
        any unexpected tensor or any expected one that never came. The LM head is tied."""
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        expected = set(self.expected_weight_names())
        seen: set[str] = set()
        for raw_name, tensor in items:
            name = raw_name.removeprefix("language_model.")  # multimodal checkpoints' prefix
            if _IGNORED_WEIGHTS.search(name) or name == "lm_head.weight":
                continue
            if name not in expected:
                raise ValueError(f"unexpected weight {raw_name!r} for {type(self).__name__}")
            seen.add(name)
            if name == "model.embed_tokens.weight":
                _copy(self.embed_tokens, tensor, name)
            elif name == "model.norm.weight":
                _copy(self.norm.weight, tensor, name)
            else:
                self._load_layer_weight(name, tensor)
        missing = sorted(expected - seen)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint lacks {len(missing)} weights: {shown}")

    def expected_weight_names(self) -> list[str]:
        c = self.config
        per_layer = [f"{n}.weight" for n in _NORMS]
        per_layer += [f"self_attn.{p}_proj.weight" for p in "qkvo"]
        per_layer += [f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")]
        if c.qkv_bias:
            per_layer += [f"self_attn.{p}_proj.bias" for p in "qkv"]
        if c.o_bias:
            per_layer.append("self_attn.o_proj.bias")
        if self.layers[0].self_attn.qk_norm:
            per_layer += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(c.num_hidden_layers):
            names += [f"model.layers.{i}.{suffix}" for suffix in per_layer]
        return names

    def _load_layer_weight(self, name: str, tensor: torch.Tensor) -> None:
        match = _LAYER_WEIGHT.match(name)
        assert match is not None  # `name` passed the expected-name check
        layer = self.layers[int(match.group(1))]
        module, kind = match.group(2), match.group(3)
        c = self.local_config
        fused_rows = {
            "self_attn.q_proj": (layer.self_attn.qkv_proj, 0),
            "self_attn.k_proj": (layer.self_attn.qkv_proj, c.q_size),
            "self_attn.v_proj": (layer.self_attn.qkv_proj, c.q_size + c.kv_size),
            "self_attn.o_proj": (layer.self_attn.o_proj, 0),
            "mlp.gate_proj": (layer.mlp.gate_up_proj, 0),
            "mlp.up_proj": (layer.mlp.gate_up_proj, c.intermediate_size),
            "mlp.down_proj": (layer.mlp.down_proj, 0),
        }
        if module in fused_rows:
            linear, start = fused_rows[module]
            linear.load_rows(kind, tensor, start)
        else:  # a norm: "input_layernorm", "self_attn.q_norm", ...
            _copy(layer.get_submodule(module).weight, tensor, name)


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
        )
    param.data.copy_(tensor)
