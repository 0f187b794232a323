"""`ModelConfig`: the facts about a model the runtime needs, read once from `config.json`.

Both spellings of the RoPE settings are accepted: the older `rope_theta` + `rope_scaling`
keys and transformers 5's `rope_parameters` dict. `generation_config.json`, when present,
adds its end-of-sequence ids (Llama 3 Instruct lists its `<|eot_id|>` only there).

What only some architectures have (per-head q/k norms, experts) is read by the
architecture's own `read_options` (`model.registry.Architecture`), which also refuses the
options it does not implement; a config of an unknown architecture keeps the common fields
(the model registry refuses it when a model is built or a server starts).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
QWEN_WINDOW_FLAG = ("qwen2", "qwen3", "qwen3_moe")  # a window only with use_sliding_window


@dataclass(frozen=True)
class RopeScaling:
    """How rotary frequencies are stretched for long contexts (HF's `rope_type`)."""

    rope_type: str = "default"  # "default" | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only


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
    hidden_act: str = "silu"
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (Qwen3)
    moe: MoEOptions | None = None  # None: a dense MLP in every layer

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
        """Longest sequence this runtime serves exactly.

        Attention here is always full; a model trained with a sliding window is exact
        only up to the window, so the window caps the context.
        """
        if self.sliding_window:
            return min(self.max_position_embeddings, self.sliding_window)
        return self.max_position_embeddings

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read `config.json` (and `generation_config.json` if present) from a model folder."""
        folder = Path(path)
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(
                f"{folder} has no config.json; it is not a Hugging Face model folder"
            )
        raw = json.loads(config_file.read_text())
        generation_file = folder / "generation_config.json"
        generation = json.loads(generation_file.read_text()) if generation_file.is_file() else None
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], generation: dict[str, Any] | None = None
    ) -> ModelConfig:
        """Build from the parsed `config.json` (and `generation_config.json`) dicts."""
        raw = _text_config(raw)
        model_type = raw.get("model_type", "")
        num_heads = int(raw["num_attention_heads"])
        hidden_size = int(raw["hidden_size"])
        head_dim = raw.get("head_dim") or hidden_size // num_heads
        num_kv_heads = int(raw.get("num_key_value_heads") or num_heads)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_attention_heads={num_heads} is not a multiple of num_key_value_heads={num_kv_heads}"
            )
        rope_theta, rope_scaling = _parse_rope(raw)
        attention_bias = bool(raw.get("attention_bias", False))
        is_qwen2 = model_type == "qwen2"
        eos_ids = _as_ids(raw.get("eos_token_id"))
        if generation is not None:
            eos_ids = _as_ids(generation.get("eos_token_id")) + eos_ids
        common = cls(
            architectures=tuple(raw.get("architectures") or ()),
            model_type=model_type,
            hidden_size=hidden_size,
            num_hidden_layers=int(raw["num_hidden_layers"]),
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
            sliding_window=_sliding_window(raw),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            hidden_act=str(raw.get("hidden_act", "silu")),
        )
        from sluice.runtime.model.registry import find_architecture  # it imports this module

        architecture = find_architecture(common)
        if architecture is None:
            return common
        return dataclasses.replace(common, **architecture.read_options(raw, common))


def _text_config(raw: dict[str, Any]) -> dict[str, Any]:
    """Multimodal wrappers keep the language model's settings under `text_config`."""
    text = raw.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in raw:
        return {**text, "architectures": raw.get("architectures")}
    return raw


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


def _parse_rope(raw: dict[str, Any]) -> tuple[float, RopeScaling]:
    params = dict(raw.get("rope_parameters") or {})
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
    )
    return float(theta), scaling


def _sliding_window(raw: dict[str, Any]) -> int | None:
    window = raw.get("sliding_window")
    if not window:
        return None
    if raw.get("model_type") in QWEN_WINDOW_FLAG and not raw.get("use_sliding_window", False):
        return None  # Qwen configs carry a window but only use it when told to
    return int(window)
