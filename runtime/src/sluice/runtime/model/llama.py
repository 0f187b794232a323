"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2) over a paged KV cache.

One implementation serves all of them: Qwen2 differs only by a bias on q/k/v, which
`ModelConfig.qkv_bias` carries. q/k/v and gate/up are fused into one matmul each;
`load_weights` slices Hugging Face's separate projections into the fused rows.

With tensor parallelism every layer is built with its rank's shard shapes
(`distributed.sharding`); the decoder layer all-reduces the attention and MLP outputs (the
row-parallel o and down projections), the embedding and the LM head are vocab-parallel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from sluice.runtime.attention.base import AttentionBackend, LayerAttention
from sluice.runtime.distributed.group import SINGLE_RANK, TensorParallelGroup
from sluice.runtime.distributed.layers import embed, gather_logits
from sluice.runtime.distributed.sharding import LlamaShard
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.forward_batch import ForwardBatch
from sluice.runtime.model.layers import Linear, RMSNorm, SwiGLUMLP
from sluice.runtime.model.rotary import RotaryEmbedding

_LAYER_WEIGHT = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
_IGNORED_WEIGHTS = re.compile(r"rotary_emb\.inv_freq$")


class LlamaAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, layer_id: int, device: torch.device | str, dtype: torch.dtype
    ):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.kv_size = config.kv_size
        self.fused = False  # rotary embedding as one compiled CPU op (model.cpu_fused_ops)
        # Mistral's and Qwen2's sliding window, where the config has one
        self.options = LayerAttention(window=config.window_for(layer_id))
        self.qkv_proj = Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, config.qkv_bias, device, dtype
        )
        self.o_proj = Linear(config.q_size, config.hidden_size, config.o_bias, device, dtype)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.fused:
            q, k = torch.ops.sluice_cpu.rotary(q, k, cos, sin)
        else:
            q, k = RotaryEmbedding.apply(q, cos, sin), RotaryEmbedding.apply(k, cos, sin)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        out = backend.forward(q, k, v, self.layer_id, batch, self.options)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class LlamaDecoderLayer(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        layer_id: int,
        device: torch.device | str,
        dtype: torch.dtype,
        tp: TensorParallelGroup = SINGLE_RANK,
    ):
        super().__init__()
        self.tp = tp
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.self_attn = LlamaAttention(config, layer_id, device, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, device, dtype)
        self.mlp = SwiGLUMLP(
            config.hidden_size, config.intermediate_size, config.mlp_bias, device, dtype
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: ForwardBatch,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        x = x + self.tp.all_reduce(self.self_attn(self.input_layernorm(x), cos, sin, batch, backend))
        return x + self.tp.all_reduce(self.mlp(self.post_attention_layernorm(x)))


class LlamaForCausalLM(nn.Module):
    """Token ids in, next-token logits out; K/V live in `batch.kv`, written by the backend.

    `config` is the whole model's; `local_config` the shapes this rank builds (the same
    without tensor parallelism)."""

    def __init__(
        self,
        config: ModelConfig,
        attn_backend: AttentionBackend,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        tp: TensorParallelGroup = SINGLE_RANK,
    ) -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"{type(self).__name__} implements SwiGLU (silu), not {config.hidden_act!r}")
        self.tp = tp
        self.shard = LlamaShard(config, tp.rank, tp.size)
        self.config = config
        self.local_config = local = self.shard.local_config()
        self.attn_backend = attn_backend
        self.embed_tokens = nn.Parameter(
            torch.empty(local.vocab_size, local.hidden_size, device=device, dtype=dtype),
            requires_grad=False,
        )
        self.rotary = RotaryEmbedding(
            config.head_dim, config.rope_theta, config.rope_scaling, device
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(local, i, device, dtype, tp) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device, dtype)
        self.lm_head = Linear(local.hidden_size, local.vocab_size, False, device, dtype)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens

    @torch.no_grad()  # not inference_mode: callers may edit the logits in place afterwards
    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits `[batch_size, vocab]` at each request's last new token.

        With `batch.return_all_logits`, `[num_tokens, vocab]` at every new token; with
        `batch.extra_logit_indices`, those tokens' rows follow the last tokens' ones. Calls the
        backend's `init_forward_metadata` first, so callers only build the batch.
        """
        self.attn_backend.init_forward_metadata(batch)
        hidden = embed(batch.input_ids, self.embed_tokens, self.shard.vocab_start, self.tp)
        cos, sin = self.rotary.cos_sin(batch.positions, hidden.dtype)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, batch, self.attn_backend)
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
        return logits[:rows].float()

    def load_weights(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]] | Mapping[str, torch.Tensor]
    ) -> None:
        """Copy Hugging Face-named tensors into the (fused) parameters, converting dtype/device.

        Raises `ValueError` naming any unexpected tensor, or any expected one that never came.
        With tensor parallelism the tensors are this rank's shards (`LlamaShard.read`).
        `lm_head.weight` is optional: without it (or with `tie_word_embeddings`) the output
        projection shares the embedding matrix.
        """
        items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
        expected = set(self.expected_weight_names())
        seen: set[str] = set()
        lm_head: torch.Tensor | None = None
        for name, tensor in items:
            if _IGNORED_WEIGHTS.search(name):
                continue
            if name not in expected and name != "lm_head.weight":
                raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
            seen.add(name)
            if name == "lm_head.weight":
                lm_head = tensor
            elif name == "model.embed_tokens.weight":
                _copy(self.embed_tokens, tensor, name)
            elif name == "model.norm.weight":
                _copy(self.norm.weight, tensor, name)
            else:
                self._load_layer_weight(name, tensor)
        missing = sorted(expected - seen)
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint lacks {len(missing)} weights: {shown}")
        if self.config.tie_word_embeddings or lm_head is None:
            self.lm_head.weight = self.embed_tokens
        else:
            if self.lm_head.weight is self.embed_tokens:  # config said tied, checkpoint disagrees
                self.lm_head.weight = nn.Parameter(
                    torch.empty_like(self.embed_tokens), requires_grad=False
                )
            _copy(self.lm_head.weight, lm_head, "lm_head.weight")

    def expected_weight_names(self) -> list[str]:
        """Every HF tensor name this model needs (`lm_head.weight` excluded: it may be tied)."""
        c = self.config
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        per_layer = [
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
            *(f"self_attn.{p}_proj.weight" for p in "qkvo"),
            *(f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
        ]
        if c.qkv_bias:
            per_layer += [f"self_attn.{p}_proj.bias" for p in "qkv"]
        if c.o_bias:
            per_layer.append("self_attn.o_proj.bias")
        if c.mlp_bias:
            per_layer += [f"mlp.{p}_proj.bias" for p in ("gate", "up", "down")]
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
        elif module == "input_layernorm":
            _copy(layer.input_layernorm.weight, tensor, name)
        else:
            _copy(layer.post_attention_layernorm.weight, tensor, name)


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
        )
    param.data.copy_(tensor)


from sluice.runtime.model.gemma import GemmaForCausalLM  # noqa: E402 (until the registry lands)
from sluice.runtime.model.gpt_oss import GptOssForCausalLM  # noqa: E402

# HF `architectures` names -> implementation
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Gemma2ForCausalLM": GemmaForCausalLM,
    "Gemma3ForCausalLM": GemmaForCausalLM,
    "GptOssForCausalLM": GptOssForCausalLM,
}
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
}


def model_class_for(config: ModelConfig) -> type[nn.Module]:
    """The implementation for `config.architectures` (or `model_type` when that is empty)."""
    names = list(config.architectures) or [_MODEL_TYPES.get(config.model_type, config.model_type)]
    for name in names:
        if name in MODEL_REGISTRY:
            return MODEL_REGISTRY[name]
    raise ValueError(
        f"unsupported model architecture {', '.join(names) or '(none given)'}; "
        f"supported: {', '.join(MODEL_REGISTRY)}"
    )
