"""What a model family declares: its architecture record and its weight rules (a leaf of
the model package: no family, no model class, no registry here).

An `Architecture` names the Hugging Face `architectures` entries (and `model_type`s) it
serves, the decoder layer its model stacks, the options it reads from `config.json`
(refusing those it does not implement), and its weight rules: for each checkpoint tensor,
which parameter it fills, which piece of a fused parameter, and how tensor parallelism
splits it (`model.sharding`). Adding an architecture is one module that defines an
`ARCHITECTURES` tuple, named once in `model.registry.FAMILIES`.

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
- `split`: `replicated`, `vocab`, `column` or `row` (see `model.sharding`).

A rule whose target the model lacks (a bias the config turned off, q/k norms on a model
without them, experts in a dense layer) is inactive: a checkpoint tensor only it matches is
refused as unexpected, and no tensor is expected from it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from sluice.runtime.model.config import ModelConfig

if TYPE_CHECKING:
    from torch import nn

# the piece of a fused parameter a checkpoint tensor fills, and how tensor parallelism splits
# it (see `model.sharding`)
SPLITS = ("replicated", "vocab", "column", "row")
# the dimension a column/row split cuts: attention heads, KV heads, the dense MLP's
# intermediate features or each expert's
PIECES = ("", "q", "k", "v", "o", "gate", "up", "down", "expert_gate", "expert_up", "expert_down")
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
    this rank's shapes. `model_class` is the whole model (None: `model.causal_lm.CausalLM`,
    which the loader supplies; a family that needs another embedding or head names its own). `read_options(raw config.json, common config)`
    returns the `ModelConfig` fields this family sets beyond the common ones and raises
    `ValueError` (one line, naming the option) for what it does not implement.
    """

    names: tuple[str, ...]
    decoder_layer: Callable[..., nn.Module]
    weight_rules: tuple[WeightRule, ...]
    model_types: tuple[str, ...] = ()
    model_class: Callable[..., nn.Module] | None = None  # None: CausalLM
    read_options: Callable[[Mapping[str, Any], ModelConfig], dict[str, Any]] = _no_options
    # a checkpoint tensor's name as the weight rules spell it, None for a tensor this
    # runtime does not use (a multimodal model's vision tower); None: the names as they are
    checkpoint_name: Callable[[str], str | None] | None = None
