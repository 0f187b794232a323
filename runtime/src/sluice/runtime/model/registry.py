"""The model registry: every architecture Sluice serves, declared in one place each.

An `Architecture` names the Hugging Face `architectures` entries (and `model_type`s) it
serves, the decoder layer its model stacks, the options it reads from `config.json`
(refusing those it does not implement), and its weight rules: for each checkpoint tensor,
which parameter it fills, which piece of a fused parameter, and how tensor parallelism
splits it (`distributed.sharding`). Adding an architecture is one module that defines an
`ARCHITECTURES` tuple, named once in `ARCHITECTURE_MODULES` below.

Weight rules (`WeightRule`):
- `hf_regex` matches the whole checkpoint name; `{layer}` and `{expert}` stand for the layer
  and expert numbers (`model\\.layers\\.{layer}\\.self_attn\\.q_proj\\.weight`). Write the rest
  literally (dots escaped), so that the expected names can be listed from it.
- `target` is the parameter's path in the model (`layers.{layer}.self_attn.qkv_proj.weight`).
  With `{expert}` in the regex, the parameter is stacked per expert: its first dimension is
  the expert.
- `piece`: where in a fused parameter the tensor goes (`q`, `k`, `v` in qkv; `gate`, `up` in
  gate_up; `expert_gate`, `expert_up` in each expert's gate_up; `o`, `down`, `expert_down`
  name the dimension a row split cuts); `""`: the whole parameter.
- `split`: `replicated`, `vocab`, `column` or `row` (see `distributed.sharding`).

A rule whose target the model lacks (a bias the config turned off, q/k norms on a model
without them, experts in a dense layer) is inactive: a checkpoint tensor only it matches is
refused as unexpected, and no tensor is expected from it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.sharding import PIECES, SPLITS

if TYPE_CHECKING:
    from torch import nn

# modules defining `ARCHITECTURES`, imported on the first lookup (they import this module)
ARCHITECTURE_MODULES = (
    "sluice.runtime.model.llama",
    "sluice.runtime.model.qwen3",
    "sluice.runtime.model.moe_models",
    "sluice.runtime.model.gemma",
    "sluice.runtime.model.gpt_oss",
)
_NUMBER = r"(?P<{}>\d+)"


@dataclass(frozen=True)
class WeightRule:
    """One checkpoint tensor family → one (piece of a) model parameter, and its TP split."""

    hf_regex: str
    target: str
    piece: str = ""
    split: str = "replicated"

    def __post_init__(self) -> None:
        if self.piece not in PIECES:
            raise ValueError(f"piece {self.piece!r} is not one of {PIECES}")
        if self.split not in SPLITS:
            raise ValueError(f"split {self.split!r} is not one of {SPLITS}")

    @classmethod
    def literal(
        cls, hf_name: str, target: str, piece: str = "", split: str = "replicated"
    ) -> WeightRule:
        """A rule for one literal name pattern (`model.layers.{layer}.mlp.up_proj.weight`)."""
        return cls(re.escape(hf_name).replace(r"\{", "{").replace(r"\}", "}"), target, piece, split)

    @cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(
            self.hf_regex.replace("{layer}", _NUMBER.format("layer")).replace(
                "{expert}", _NUMBER.format("expert")
            )
        )

    @property
    def per_expert(self) -> bool:
        return "{expert}" in self.hf_regex

    def hf_name(self, layer: int | None = None, expert: int | None = None) -> str:
        """The checkpoint name this rule matches for `layer` (and `expert`)."""
        name = self.hf_regex.replace("{layer}", str(layer)).replace("{expert}", str(expert))
        return re.sub(r"\\(.)", r"\1", name)

    def target_name(self, layer: int | None) -> str:
        return self.target.replace("{layer}", str(layer))


def _no_options(raw: Mapping[str, Any], config: ModelConfig) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Architecture:
    """One architecture family: what it serves, what it builds, how its weights load.

    `decoder_layer(local_config, layer_id, device, dtype, tp)` builds layer `layer_id` from
    this rank's shapes. `model_class` is the whole model (`model.causal_lm.CausalLM` unless the
    family needs another embedding or head). `read_options(raw config.json, common config)`
    returns the `ModelConfig` fields this family sets beyond the common ones and raises
    `ValueError` (one line, naming the option) for what it does not implement.
    """

    names: tuple[str, ...]
    decoder_layer: Callable[..., nn.Module]
    weight_rules: tuple[WeightRule, ...]
    model_types: tuple[str, ...] = ()
    model_class: Callable[..., nn.Module] | None = None  # None: CausalLM
    read_options: Callable[[Mapping[str, Any], ModelConfig], dict[str, Any]] = _no_options

    def build_model_class(self) -> Callable[..., nn.Module]:
        if self.model_class is not None:
            return self.model_class
        from sluice.runtime.model.causal_lm import CausalLM

        return CausalLM


_BY_NAME: dict[str, Architecture] = {}
_BY_MODEL_TYPE: dict[str, Architecture] = {}


def register(architecture: Architecture) -> Architecture:
    """Add `architecture` under each of its names (a later one with the same name wins)."""
    for name in architecture.names:
        _BY_NAME[name] = architecture
    for model_type in architecture.model_types:
        _BY_MODEL_TYPE[model_type] = architecture
    return architecture


def _load() -> None:
    if _BY_NAME:
        return
    for module in ARCHITECTURE_MODULES:
        for architecture in importlib.import_module(module).ARCHITECTURES:
            register(architecture)


def supported_architectures() -> list[str]:
    """Every Hugging Face `architectures` name served, in registration order."""
    _load()
    return list(_BY_NAME)


def find_architecture(config: ModelConfig) -> Architecture | None:
    """The architecture of `config.architectures` (or of its `model_type` when that list is
    empty), or None when none is served."""
    _load()
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
