"""LoRA adapters in PEFT's format: read and validate one
adapter folder (`adapter_config.json` + `adapter_model.safetensors`).

An adapter is refused with a `LoraAdapterError` naming the reason (the API answers 400
with it) when a file is missing or unreadable, its rank exceeds `--max-lora-rank`, it
targets a module the model lacks (or one LoRA is not implemented for here: the embedding,
the LM head, DoRA, trained biases, `modules_to_save`), a tensor's shape does not fit the
model, or its config names another base model.

The weights are kept whole (not sharded) in fp32 on the CPU with their scaling
(`lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA): applying an adapter is
`y += ((x @ A.T) @ B.T) * scaling`, in PEFT's order.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sluice.runtime.lora.spec import LoraAdapterError
from sluice.runtime.model.config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# the modules LoRA can target here: the Llama family's seven projections
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_KEY = re.compile(
    r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\."
    r"(\w+?)\.lora_(A|B)(?:\.[\w-]+)?\.weight$"
)

__all__ = ["LoraAdapterError", "LoraWeights", "load_adapter", "module_shapes"]


@dataclass
class LoraWeights:
    """One adapter's weights: per (layer, module) `A [r, in]` and `B [out, r]`."""

    name: str
    path: str
    rank: int
    scaling: float
    base_model: str
    a: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    b: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)

    @property
    def modules(self) -> set[str]:
        return {m for _, m in self.a}


def module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in features, out features) of each target module."""
    h, i = config.hidden_size, config.intermediate_size
    return {
        "q_proj": (h, config.q_size),
        "k_proj": (h, config.kv_size),
        "v_proj": (h, config.kv_size),
        "o_proj": (config.q_size, h),
        "gate_proj": (h, i),
        "up_proj": (h, i),
        "down_proj": (i, h),
    }


def _read_config(folder: Path) -> dict[str, Any]:
    if not folder.is_dir():
        raise LoraAdapterError(f"adapter folder {str(folder)!r} does not exist")
    cfg_path = folder / CONFIG_FILE
    if not cfg_path.is_file():
        raise LoraAdapterError(f"adapter folder {str(folder)!r} has no {CONFIG_FILE}")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoraAdapterError(f"cannot read {cfg_path}: {exc}") from exc
    if not isinstance(cfg, dict):
        raise LoraAdapterError(f"{cfg_path} is not a JSON object")
    return cfg


def _check_config(cfg: dict[str, Any], max_rank: int) -> tuple[int, float]:
    """(rank, scaling) of a PEFT LoRA config, or the reason it cannot be served."""
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoraAdapterError(f"peft_type {peft_type} is not LoRA")
    refused = {
        "use_dora": "DoRA adapters are not supported",
        "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D weights) is not supported",
    }
    for key, why in refused.items():
        if cfg.get(key):
            raise LoraAdapterError(why)
    if str(cfg.get("bias", "none")) != "none":
        raise LoraAdapterError(f"bias {cfg.get('bias')!r}: trained biases are not supported")
    try:
        rank = int(cfg["r"])
        alpha = float(cfg.get("lora_alpha", rank))
    except (KeyError, TypeError, ValueError) as exc:
        raise LoraAdapterError(f"{CONFIG_FILE} lacks a valid 'r' / 'lora_alpha'") from exc
    if rank < 1:
        raise LoraAdapterError(f"rank {rank} must be >= 1")
    if rank > max_rank:
        raise LoraAdapterError(f"rank {rank} exceeds --max-lora-rank {max_rank}")
    targets = cfg.get("target_modules") or []
    if isinstance(targets, str):  # a regex (PEFT allows one): the weights are checked instead
        targets = []
    unknown = sorted(set(targets) - set(TARGET_MODULES))
    if unknown:
        raise LoraAdapterError(
            f"target module(s) {', '.join(unknown)} are not in this model's LoRA targets "
            f"({', '.join(TARGET_MODULES)})"
        )
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    return rank, scaling


def _same_base(claimed: str, ours: set[str]) -> bool:
    if not claimed:
        return True
    tail = claimed.rstrip("/").rsplit("/", 1)[-1].lower()
    return claimed.lower() in ours or tail in ours


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHTS_FILES:
        file = folder / name
        if not file.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(file), device="cpu")
            return torch.load(str(file), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise LoraAdapterError(f"cannot read {file}: {exc}") from exc
    raise LoraAdapterError(f"adapter folder {str(folder)!r} has no {WEIGHTS_FILES[0]}")


def load_adapter(
    name: str,
    path: str | Path,
    config: ModelConfig,
    max_rank: int,
    base_names: set[str] | None = None,
) -> LoraWeights:
    """Read and validate the adapter at `path` for a model of `config`.

    `base_names`: names the base model goes by (its folder, its served name), lower-case; an
    adapter whose `base_model_name_or_path` is none of them is refused."""
    folder = Path(path)
    cfg = _read_config(folder)
    rank, scaling = _check_config(cfg, max_rank)
    base = str(cfg.get("base_model_name_or_path") or "")
    if base_names is not None and not _same_base(base, base_names):
        raise LoraAdapterError(
            f"adapter was trained for base model {base!r}, not this server's "
            f"({', '.join(sorted(base_names))})"
        )
    tensors = _read_tensors(folder)
    shapes = module_shapes(config)
    out = LoraWeights(name, str(path), rank, scaling, base)
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraAdapterError(
                f"tensor {key!r} is not a LoRA weight of a decoder projection (adapters on the "
                "embedding or the LM head are not supported)"
            )
        layer, module, which = int(m.group(1)), m.group(2), m.group(3)
        if module not in shapes:
            raise LoraAdapterError(
                f"target module {module!r} (tensor {key!r}) is not in this model"
            )
        if layer >= config.num_hidden_layers:
            raise LoraAdapterError(
                f"tensor {key!r} is for layer {layer}; the model has {config.num_hidden_layers}"
            )
        fan_in, fan_out = shapes[module]
        want = (rank, fan_in) if which == "A" else (fan_out, rank)
        if tuple(tensor.shape) != want:
            raise LoraAdapterError(
                f"tensor {key!r} has shape {tuple(tensor.shape)}; this model and rank {rank} need "
                f"{want} (an adapter for another base model?)"
            )
        target = out.a if which == "A" else out.b
        target[(layer, module)] = tensor.to(torch.float32)
    if not out.a:
        raise LoraAdapterError(f"{folder} holds no LoRA weights")
    if out.a.keys() != out.b.keys():
        lone = sorted(set(out.a) ^ set(out.b))
        raise LoraAdapterError(f"LoRA A and B weights do not pair up (e.g. layer/module {lone[0]})")
    return out
