"""LoRA adapters in PEFT's format: read and validate one
adapter folder (`adapter_config.json` + `adapter_model.safetensors`).

An adapter is refused with a `LoraAdapterError` naming the reason (the API answers 400
with it) when a file is missing or unreadable, its rank exceeds `--max-lora-rank`, it
targets a module the model has no LoRA slot for (`lora.layout`: the embedding, the LM head,
experts, a layer that lacks the module) or uses what is not implemented here (DoRA, trained
biases, `modules_to_save`), or a tensor's shape does not fit the model: the base model is
matched by its architecture's modules and their shapes. The `base_model_name_or_path` an
adapter names is only compared (a warning when it is none of the names this model goes
by): a hub id, a training machine's folder and an HF cache snapshot all name one model.

The weights are kept whole (not sharded) in fp32 on the CPU with their scaling
(`lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA): applying an adapter is
`y += ((x @ A.T) @ B.T) * scaling`, in PEFT's order.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sluice.runtime.lora.layout import LoraLayout
from sluice.runtime.lora.spec import LoraAdapterError

logger = logging.getLogger(__name__)
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")
# PEFT's tensor names: `base_model.model.<module>.lora_A[.<adapter name>].weight`
_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_(A|B)(?:\.[\w-]+)?\.weight$")

__all__ = ["LoraAdapterError", "LoraWeights", "load_adapter"]


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


def _check_config(cfg: dict[str, Any], max_rank: int, layout: LoraLayout) -> tuple[int, float]:
    """(rank, scaling) of a PEFT LoRA config, or the reason it cannot be served."""
    peft_type = str(cfg.get("peft_type", "LORA")).upper()
    if peft_type != "LORA":
        raise LoraAdapterError(f"peft_type {peft_type} is not LoRA")
    parameters = cfg.get("target_parameters")
    if parameters:  # PEFT's LoRA on raw parameters: the experts of a mixture of experts
        names = [parameters] if isinstance(parameters, str) else parameters
        raise LoraAdapterError(
            f"target_parameters {', '.join(map(str, names))}: LoRA on expert weights is not "
            f"supported ({layout.architecture} adapts {', '.join(layout.modules)})"
        )
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
    unknown = sorted(set(targets) - set(layout.modules))
    if unknown:
        raise LoraAdapterError(
            f"target module(s) {', '.join(unknown)} are not in this model's LoRA targets "
            f"({layout.architecture}: {', '.join(layout.modules)})"
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
    layout: LoraLayout,
    max_rank: int,
    base_names: set[str] | None = None,
) -> LoraWeights:
    """Read and validate the adapter at `path` for a model of `layout` (the projections it
    offers per layer, `lora.layout`).

    `base_names`: names the base model goes by (its folder, its served name, its hub id),
    lower-case; an adapter whose `base_model_name_or_path` is none of them is loaded with a
    warning (its shapes decide)."""
    folder = Path(path)
    cfg = _read_config(folder)
    rank, scaling = _check_config(cfg, max_rank, layout)
    base = str(cfg.get("base_model_name_or_path") or "")
    if base_names is not None and not _same_base(base, base_names):
        logger.warning(
            "adapter %s names base model %r, not one of this server's names (%s); loaded "
            "because every tensor fits this model's modules", name, base, ", ".join(sorted(base_names)),
        )  # fmt: skip
    tensors = _read_tensors(folder)
    out = LoraWeights(name, str(path), rank, scaling, base)
    unused = 0
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise LoraAdapterError(
                f"tensor {key!r} is not a LoRA weight of a decoder projection (adapters on the "
                "embedding or the LM head are not supported)"
            )
        hf_module, which = layout.module_name(m.group(1)), m.group(2)
        if hf_module is None:  # the vision tower of a model served as text
            unused += 1
            continue
        found = layout.find(hf_module)
        if found is None:
            raise LoraAdapterError(f"tensor {key!r}: {layout.no_slot(hf_module)}")
        layer, projection = found
        fan_in, fan_out = projection.shape
        want = (rank, fan_in) if which == "A" else (fan_out, rank)
        if tuple(tensor.shape) != want:
            raise LoraAdapterError(
                f"tensor {key!r} has shape {tuple(tensor.shape)}; this model and rank {rank} need "
                f"{want} (an adapter for another base model?)"
            )
        weights = out.a if which == "A" else out.b
        weights[(layer, projection.module)] = tensor.to(torch.float32)
    if unused:
        logger.info("adapter %s: %d tensors on modules the text model does not have (its "
                    "vision tower) do not apply", name, unused)  # fmt: skip
    if not out.a:
        raise LoraAdapterError(f"{folder} holds no LoRA weights for the served (text) model")
    if out.a.keys() != out.b.keys():
        lone = sorted(set(out.a) ^ set(out.b))
        raise LoraAdapterError(f"LoRA A and B weights do not pair up (e.g. layer/module {lone[0]})")
    return out
