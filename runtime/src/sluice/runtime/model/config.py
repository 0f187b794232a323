"""`ModelConfig`: the facts about a model the runtime needs, read once from `config.json`.

Both spellings of the RoPE settings are accepted: the older `rope_theta` + `rope_scaling`
keys and transformers 5's `rope_parameters` dict, also in its per-layer-type form (Gemma 3:
one dict for `full_attention` layers, one for `sliding_attention` layers).

A field the config leaves out takes transformers' default for the family
(`config_defaults`). Which layers attend through a sliding window is `layer_types`
(transformers' list of `"full_attention"` / `"sliding_attention"`), derived as
transformers derives it for configs without one (Gemma 2 and gpt-oss: every second layer
is global; Gemma 3: every `sliding_window_pattern`-th, 6 by default; Qwen2 with
`use_sliding_window`: the layers from `max_window_layers` on slide; Mistral: every layer). The windows are honoured by the attention backends, so a windowed
model serves its whole `max_position_embeddings`. `generation_config.json`, when present,
adds its end-of-sequence ids (Llama 3 Instruct lists its `<|eot_id|>` only there).

What only some architectures have (per-head q/k norms, experts) is read by the
architecture's own `read_options` (`model.registry.Architecture`), which also refuses the
options it does not implement; a config of an unknown architecture keeps the common fields
(the model registry refuses it when a model is built or a server starts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.model.config_defaults import TEXT_MODEL_TYPES, global_every, with_defaults

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
QWEN_WINDOW_FLAG = ("qwen2", "qwen3", "qwen3_moe")  # a window only with use_sliding_window
SLIDING = "sliding_attention"
FULL = "full_attention"


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for long contexts (HF's `rope_type`)."""

    rope_type: str = "default"  # "default" | "linear" | "llama3" | "yarn"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 and yarn
    beta_fast: float = 32.0  # yarn only, from here on
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float | None = None  # cos/sin multiplier; None: from factor (and mscale)
    mscale: float | None = None
    mscale_all_dim: float | None = None


@dataclass(frozen=True)
class SwiGLUClamp:
    """gpt-oss's expert activation: `gate <= limit`, `-limit <= up <= limit`, then
    `(up + 1) * gate * sigmoid(alpha * gate)` (`swiglu_alpha`, `swiglu_limit`)."""

    alpha: float = 1.702
    limit: float = 7.0


@dataclass(frozen=True)
class MoEOptions:
    """A mixture-of-experts MLP: `num_experts` SwiGLU experts of `intermediate_size` features,
    `top_k` of them per token, chosen by a softmax router; `renormalize` rescales the chosen
    weights to sum to one (Qwen3-MoE's `norm_topk_prob`; always for Mixtral). `sparse_layers`
    are the layers with experts; the others keep a dense MLP of the model's
    `intermediate_size` (Qwen3-MoE's `decoder_sparse_step` / `mlp_only_layers`)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    sparse_layers: tuple[int, ...]
    clamp: SwiGLUClamp | None = None  # gpt-oss's clamped activation; None: plain SwiGLU


@dataclass(frozen=True)
class ModelConfig:
    architectures: tuple[str, ...]
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (Qwen2 always; Llama when attention_bias)
    o_bias: bool  # bias on the output projection (Llama's attention_bias only)
    mlp_bias: bool
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None = None
    sliding_window: int | None = None  # None: full attention in every layer
    torch_dtype: str | None = None  # the checkpoint's own dtype, e.g. "bfloat16"
    hidden_act: str = "silu"  # the MLP's activation (`hidden_act` or Gemma's `hidden_activation`)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    moe: MoEOptions | None = None  # None: a dense MLP in every layer
    # per layer: "full_attention" or "sliding_attention" (the latter only with sliding_window)
    layer_types: tuple[str, ...] = ()
    # the RoPE base of sliding layers where it differs from `rope_theta` (Gemma 3's local base)
    rope_local_theta: float | None = None
    # the attention scores' scale; None: the backend's `1 / sqrt(head_dim)` (Gemma:
    # `query_pre_attn_scalar ** -0.5`)
    attention_scale: float | None = None
    # scores soft-capped to `cap * tanh(score / cap)` (Gemma 2's `attn_logit_softcapping`)
    attention_softcap: float | None = None
    # the final logits soft-capped likewise (Gemma 2's `final_logit_softcapping`)
    final_logit_softcap: float | None = None
    # the whole (text) config.json, for the families' `read_options` (model code reads the
    # typed fields above, never this)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def context_length(self) -> int:
        """Longest sequence this runtime serves exactly: sliding windows are honoured per
        layer by the attention backends, so it is the model's whole position range."""
        return self.max_position_embeddings

    def window_for(self, layer_id: int) -> int | None:
        """The sliding window of layer `layer_id`, None for a full-attention layer."""
        if self.sliding_window and self.layer_types and self.layer_types[layer_id] == SLIDING:
            return self.sliding_window
        return None

    @classmethod
    def common(cls, raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
        """The fields every family shares, from the parsed `config.json` (and
        `generation_config.json`) dicts; `model.registry.model_config` adds the family's own."""
        raw = _text_config(raw)
        model_type = raw.get("model_type", "")
        hidden_act = str(raw.get("hidden_activation") or raw.get("hidden_act") or "silu")
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden_size // num_heads
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
            )
        rope_theta, rope_scaling, rope_local_theta = _parse_rope(raw)
        num_layers = int(raw["num_hidden_layers"])
        sliding_window = _sliding_window(raw)
        attention_bias = bool(raw.get("attention_bias", False))
        is_qwen2 = model_type == "qwen2"
        eos_ids = _as_ids(raw.get("eos_token_id"))
        if generation is not None:
            eos_ids = _as_ids(generation.get("eos_token_id")) + eos_ids
        common = cls(
            architectures=tuple(raw.get("architectures") or ()),
            model_type=model_type,
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=int(head_dim),
            intermediate_size=int(raw["intermediate_size"]),
            vocab_size=int(raw["vocab_size"]),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            eos_token_ids=tuple(dict.fromkeys(eos_ids)),  # de-duplicated, order kept
            bos_token_id=raw.get("bos_token_id"),
            sliding_window=sliding_window,
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            hidden_act=hidden_act,
            layer_types=_layer_types(raw, num_layers, sliding_window),
            rope_local_theta=rope_local_theta,
            raw=raw,
        )
        return common

    def with_options(self, options: dict[str, Any]) -> ModelConfig:
        """This config with a family's options (`Architecture.read_options`) set."""
        return dataclasses.replace(self, **options)


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The language model's settings over its family's defaults (`config_defaults`);
    multimodal wrappers keep them under `text_config`."""
    text = raw.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in raw:
        model_type = TEXT_MODEL_TYPES.get(str(raw.get("model_type", "")))
        # the wrapper's token ids and dtype hold for its language model (Gemma 3 4B lists
        # its end-of-turn id only at the top)
        outer = {k: raw[k] for k in _WRAPPER_FIELDS if raw.get(k) is not None}
        raw = {"model_type": model_type, **outer, **text, "architectures": raw.get("architectures")}
    return with_defaults(raw)


_WRAPPER_FIELDS = ("eos_token_id", "bos_token_id", "pad_token_id", "torch_dtype", "dtype")


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _parse_rope(raw: dict[str, Any]) -> tuple[float, RopeScaling, float | None]:
    """`rope_theta`, the scaling of full-attention layers, and the base of sliding layers
    when the config gives them their own (None: the same base)."""
    params = dict(raw.get("rope_parameters") or {})
    local_theta = None
    if isinstance(params.get(FULL), dict) or isinstance(params.get(SLIDING), dict):
        local = params.get(SLIDING) or {}
        if local.get("rope_type", "default") != "default":
            raise ValueError("scaled RoPE on sliding-window layers is not supported")
        local_theta = float(local["rope_theta"]) if "rope_theta" in local else None
        params = dict(params.get(FULL) or {})
    elif raw.get("rope_local_base_freq") is not None:  # Gemma 3 configs of transformers 4
        local_theta = float(raw["rope_local_base_freq"])
    legacy = raw.get("rope_scaling") or {}
    merged = {**legacy, **params}
    theta = merged.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type") or merged.get("type") or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    partial = merged.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported")
    max_pos = int(raw.get("max_position_embeddings", 2048))
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            raw.get("original_max_position_embeddings")
            or merged.get("original_max_position_embeddings")
            or max_pos
        ),
        beta_fast=float(merged.get("beta_fast") or 32.0),
        beta_slow=float(merged.get("beta_slow") or 1.0),
        truncate=bool(merged.get("truncate", True)),
        attention_factor=_optional_float(merged.get("attention_factor")),
        mscale=_optional_float(merged.get("mscale")),
        mscale_all_dim=_optional_float(merged.get("mscale_all_dim")),
    )
    return float(theta), scaling, local_theta


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _layer_types(raw: dict[str, Any], num_layers: int, window: int | None) -> tuple[str, ...]:
    """Each layer's attention kind; every layer full when the model has no window."""
    if not window:
        return (FULL,) * num_layers
    given = raw.get("layer_types")
    if given:
        if len(given) != num_layers or any(t not in (FULL, SLIDING) for t in given):
            raise ValueError(f"layer_types must list {FULL!r}/{SLIDING!r} for all {num_layers} layers")
        return tuple(given)
    if raw.get("model_type") in QWEN_WINDOW_FLAG:  # the layers from max_window_layers on slide
        first = int(raw.get("max_window_layers", num_layers))
        return tuple(SLIDING if i >= first else FULL for i in range(num_layers))
    every = global_every(raw)
    if every:
        return tuple(SLIDING if (i + 1) % every else FULL for i in range(num_layers))
    return (SLIDING,) * num_layers  # Mistral


def _sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if not window:
        return None
    if raw.get("model_type") in QWEN_WINDOW_FLAG and not raw.get("use_sliding_window", False):
        return None  # Qwen configs carry a window but only use it when told to
    return int(window)
