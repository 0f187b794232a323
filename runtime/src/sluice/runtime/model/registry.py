"""The table of model families: every family's `ARCHITECTURES`, found by Hugging Face
`architectures` name or `model_type`, and the model config with the family's options read
(`model_config`, `read_model_config`: `ModelConfig` itself looks no family up).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sluice.runtime.model import gemma, gpt_oss, llama, moe_models, qwen3
from sluice.runtime.model.architecture import Architecture
from sluice.runtime.model.config import ModelConfig

FAMILIES = (llama, qwen3, moe_models, gemma, gpt_oss)

_BY_NAME: dict[str, Architecture] = {}
_BY_MODEL_TYPE: dict[str, Architecture] = {}


def register(architecture: Architecture) -> Architecture:
    """Add `architecture` under each of its names (a later one with the same name wins)."""
    for name in architecture.names:
        _BY_NAME[name] = architecture
    for model_type in architecture.model_types:
        _BY_MODEL_TYPE[model_type] = architecture
    return architecture


for _family in FAMILIES:
    for _architecture in _family.ARCHITECTURES:
        register(_architecture)


def supported_architectures() -> list[str]:
    """Every Hugging Face `architectures` name served, in registration order."""
    return list(_BY_NAME)


def find_architecture(config: ModelConfig) -> Architecture | None:
    """The architecture of `config.architectures` (or of its `model_type` when that list is
    empty), or None when none is served."""
    if config.architectures:
        return next((_BY_NAME[n] for n in config.architectures if n in _BY_NAME), None)
    return _BY_MODEL_TYPE.get(config.model_type)


def architecture_for(config: ModelConfig) -> Architecture:
    """Like `find_architecture`, but an unserved one raises `ValueError` in one line naming
    the supported architectures."""
    architecture = find_architecture(config)
    if architecture is None:
        names = ", ".join(config.architectures) or config.model_type or "(none given)"
        raise ValueError(
            f"unsupported model architecture {names}; supported: {', '.join(supported_architectures())}"
        )
    return architecture


def model_config(raw: dict[str, Any], generation: dict[str, Any] | None = None) -> ModelConfig:
    """The config of a parsed `config.json` (and `generation_config.json`), with its
    family's options read (`Architecture.read_options`)."""
    common = ModelConfig.common(raw, generation)
    architecture = find_architecture(common)
    if architecture is None:
        return common
    return common.with_options(architecture.read_options(common.raw, common))


def read_model_config(path: str | Path) -> ModelConfig:
    """`model_config` of a model folder's `config.json` (and `generation_config.json`)."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder} has no config.json; it is not a Hugging Face model folder")
    generation_file = folder / "generation_config.json"
    generation = json.loads(generation_file.read_text()) if generation_file.is_file() else None
    return model_config(json.loads(config_file.read_text()), generation)
