"""Where LoRA attaches on a model, derived from its architecture's weight rules.

vLLM declares each model's packed modules by hand (`packed_modules_mapping`: `qkv_proj`
holds `q_proj`, `k_proj`, `v_proj`). Here the weight rules already say it: every per-layer
rule that fills a piece of a column- or row-split projection weight
(`model.layers.{layer}.self_attn.q_proj.weight` -> piece `q` of
`layers.{layer}.self_attn.qkv_proj.weight`) is one Hugging Face projection an adapter may
target, under the name PEFT's `target_modules` gives it (`q_proj`). Where the piece sits in
the fused output (`model.causal_lm.piece_rows`, as loading places the base weight) and what
this rank holds of it (`model.sharding`, asked with the base weight's own checkpoint name)
follow from the same rule, so loading, sharding and LoRA cannot disagree.

Not targets: experts (per-expert rules, or gpt-oss's whole expert tensors), routers and
norms (replicated), the embedding and the LM head (vocab-split), biases. A rule counts only
in the layers whose module exists: Qwen3-MoE's dense layers have `mlp.gate_up_proj`, its
expert layers have none, so an adapter on an expert layer's MLP has no slot there and is
refused (`lora.adapter`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property

from sluice.runtime.model.architecture import Architecture, WeightRule
from sluice.runtime.model.causal_lm import CausalLM, piece_rows
from sluice.runtime.model.sharding import ModelShard, TensorRead

COLUMN_PIECES = ("q", "k", "v", "gate", "up")  # output rows of a fused projection
ROW_PIECES = ("o", "down")  # a whole projection, its input features split by TP
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


@dataclass(frozen=True)
class LoraTarget:
    """One Hugging Face projection of one layer that an adapter may target, and where its
    LoRA term goes: this rank's output columns `[start, start + size)` of the model's module
    `fused` (relative to the layer), from `fan_in` input features; `read` is what the rank
    keeps of the adapter's A and B (the rows or columns it keeps of the base weight, asked
    of the sharder by the base weight's own checkpoint name)."""

    module: str  # the HF module's name, as PEFT's `target_modules` lists it: "q_proj"
    hf_weight: str  # the base weight's checkpoint name: "model.layers.3.self_attn.q_proj.weight"
    fused: str  # "self_attn.qkv_proj"
    start: int
    size: int
    fan_in: int
    read: TensorRead  # what this rank keeps of the adapter: the base weight's TP split
    # (in, out) features of the whole HF projection: an adapter's A is [r, in], its B [out, r]
    shape: tuple[int, int]

    @property
    def hf_module(self) -> str:
        return self.hf_weight.removesuffix(".weight")


@dataclass(frozen=True)
class LoraLayout:
    """The projections each layer of a model of `architecture` offers to adapters (per
    layer: HF module name -> `LoraTarget`)."""

    architecture: str
    layers: tuple[Mapping[str, LoraTarget], ...]
    # a checkpoint name as the weight rules spell it, None for a module the model does not
    # load (`Architecture.checkpoint_name`: a multimodal model's vision tower)
    checkpoint_name: Callable[[str], str | None] | None = None

    def module_name(self, hf_module: str) -> str | None:
        """An adapter's module name as this layout knows it; None: a module the served
        model does not have (its vision tower), whose adapter weights do not apply."""
        if self.checkpoint_name is None:
            return hf_module
        renamed = self.checkpoint_name(f"{hf_module}.weight")
        return None if renamed is None else renamed.removesuffix(".weight")

    @property
    def modules(self) -> tuple[str, ...]:
        """Every module name some layer offers, in declaration order."""
        return tuple(dict.fromkeys(m for layer in self.layers for m in layer))

    @cached_property
    def _by_hf_module(self) -> dict[str, tuple[int, LoraTarget]]:
        return {t.hf_module: (i, t) for i, layer in enumerate(self.layers) for t in layer.values()}

    def find(self, hf_module: str) -> tuple[int, LoraTarget] | None:
        """The layer and target of a checkpoint module name (`model.layers.3.self_attn.q_proj`),
        or None where the model has no LoRA slot for it."""
        return self._by_hf_module.get(hf_module)

    def no_slot(self, hf_module: str) -> str:
        """Why `hf_module` (no slot: `find` gave None) cannot be adapted, in one line."""
        match = _LAYER.match(hf_module)
        if match is None:
            return (f"{hf_module!r} is not a decoder projection (adapters on the embedding or "
                    "the LM head are not supported)")  # fmt: skip
        layer, module = int(match.group(1)), match.group(2)
        if layer >= len(self.layers):
            return f"{hf_module!r} is for layer {layer}; the model has {len(self.layers)}"
        offered = ", ".join(self.layers[layer]) or "nothing"
        return (f"target module {module!r} of layer {layer} has no LoRA slot: "
                f"{self.architecture} adapts {offered} there")  # fmt: skip


def is_projection(rule: WeightRule) -> bool:
    """Whether `rule` fills (a piece of) a per-layer projection weight LoRA can adapt."""
    return (
        "{layer}" in rule.target
        and rule.target.endswith(".weight")
        and not rule.per_expert
        and (
            (rule.split == "column" and rule.piece in COLUMN_PIECES)
            or (rule.split == "row" and rule.piece in ROW_PIECES)
        )
    )


def lora_layout(
    architecture: Architecture, shard: ModelShard, has_module: Callable[[str], bool]
) -> LoraLayout:
    """The layout of a model of `architecture` on `shard`'s rank. `has_module(path)`: whether
    the model has a module at `path` (`layers.0.mlp.gate_up_proj`)."""
    local = shard.local_config()
    whole = ModelShard(shard.config)
    hidden = local.hidden_size
    rules = [r for r in architecture.weight_rules if is_projection(r)]
    layers: list[dict[str, LoraTarget]] = []
    for layer in range(shard.config.num_hidden_layers):
        targets: dict[str, LoraTarget] = {}
        for rule in rules:
            fused = rule.target_name(layer).removesuffix(".weight")
            if not has_module(fused):
                continue  # this layer has no such module (an expert layer's MLP)
            hf_weight = rule.hf_name(layer)
            module = hf_weight.removesuffix(".weight").rsplit(".", 1)[-1]
            if module in targets:
                raise ValueError(f"{architecture.names[0]}: two LoRA targets named {module!r} "
                                 f"in layer {layer}")  # fmt: skip
            width = whole.piece_width(rule.piece)
            if rule.split == "column":
                start, size = piece_rows(rule.piece, local)
                fan_in, shape = hidden, (hidden, width)
            else:
                start, size = 0, hidden
                fan_in, shape = shard.piece_width(rule.piece), (width, hidden)
            relative = fused.removeprefix(f"layers.{layer}.")
            targets[module] = LoraTarget(
                module, hf_weight, relative, start, size, fan_in, shard.read(hf_weight), shape
            )
        layers.append(targets)
    return LoraLayout(architecture.names[0], tuple(layers), architecture.checkpoint_name)


def model_lora_layout(model: CausalLM) -> LoraLayout:
    """The layout of a built (perhaps quantized) model: its architecture's rules, its rank's
    shapes, the modules it has."""

    def has_module(path: str) -> bool:
        try:
            model.get_submodule(path)
        except AttributeError:
            return False
        return True

    return lora_layout(model.architecture, model.shard, has_module)
