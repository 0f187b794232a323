"""Which part of each weight a tensor-parallel rank holds (Megatron-LM's layout).

- column-parallel (output rows split): q/k/v, gate/up and each expert's gate/up; each rank
  computes its own heads and its own share of the MLP's (or each expert's) intermediate
  features, with no communication;
- row-parallel (input columns split): o, down and each expert's down; each rank's partial
  sums are added by an all-reduce (their biases are added once: rank 0 holds them, the
  others hold zeros);
- vocab-parallel: the embedding and the LM head hold `ceil(vocab / tp)` rows each (the last
  rank's missing rows are zero padding); the embedding's lookups are all-reduced, the
  logits all-gathered;
- replicated: norms (the per-head q/k norms included) and MoE routers;
- KV heads are split when `num_kv_heads >= tp`, else replicated: rank r holds KV head
  `r * num_kv_heads // tp`, the one its query heads attend to.

Which split and which piece each checkpoint tensor is comes from its architecture's weight
rules (`model.architecture.WeightRule`: `split` one of `SPLITS`, `piece` one of `PIECES`);
`ModelShard.read` turns them into what to read of each tensor, so a rank reads only its
slices (safetensors' `get_slice`) instead of loading whole tensors and cutting them.
`tensor_parallel_problem` says at start-up why a model cannot be split N ways.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluice.runtime.model.architecture import PIECES, SPLITS
from sluice.runtime.model.config import ModelConfig

_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


class ShardRule(Protocol):
    """What sharding needs of a weight rule (`model.registry.WeightRule` is one)."""

    @property
    def pattern(self) -> re.Pattern[str]: ...
    @property
    def split(self) -> str: ...
    @property
    def piece(self) -> str: ...


@dataclass(frozen=True)
class TensorRead:
    """What a rank reads of one checkpoint tensor: rows `[rows[0], rows[1])` of dim 0 and
    columns `[cols[0], cols[1])` of dim 1 (None: all), zero rows appended up to `pad_rows`
    (a padded vocab shard), or nothing at all (`zeros`: a zero tensor of the local shape)."""

    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None
    pad_rows: int = 0
    zeros: bool = False

    @property
    def whole(self) -> bool:
        return self.rows is None and self.cols is None and not self.pad_rows and not self.zeros


WHOLE = TensorRead()


@dataclass(frozen=True)
class ModelShard:
    """Rank `rank` of `size` of a model described by `config`, split by `rules` (its
    architecture's weight rules; without them only the vocab tensors are split)."""

    config: ModelConfig
    rank: int = 0
    size: int = 1
    rules: Sequence[ShardRule] = field(default=(), compare=False)

    @property
    def heads(self) -> int:
        return self.config.num_attention_heads // self.size

    @property
    def kv_heads(self) -> int:
        return max(1, self.config.num_key_value_heads // self.size)

    @property
    def kv_head_start(self) -> int:
        """The first KV head this rank holds (with replication, the one it shares)."""
        return self.rank * self.config.num_key_value_heads // self.size

    @property
    def intermediate(self) -> int:
        return self.config.intermediate_size // self.size

    @property
    def expert_intermediate(self) -> int:
        """Each expert's intermediate features on this rank (0 without experts)."""
        moe = self.config.moe
        return moe.intermediate_size // self.size if moe is not None else 0

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def local_config(self) -> ModelConfig:
        """The shapes this rank builds: its heads, its MLP (and expert) share, its vocab rows."""
        if self.size == 1:
            return self.config
        moe = self.config.moe
        return dataclasses.replace(
            self.config,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            vocab_size=self.vocab_per_rank,
            moe=None
            if moe is None
            else dataclasses.replace(moe, intermediate_size=self.expert_intermediate),
        )

    def read(self, name: str) -> TensorRead:
        """What this rank reads of the checkpoint tensor `name` (a Hugging Face name)."""
        if self.size == 1:
            return WHOLE
        if name in _VOCAB:
            return self._vocab_rows()
        for rule in self.rules:
            if rule.pattern.fullmatch(name):
                return self.read_part(rule.split, rule.piece, name.endswith(".bias"))
        return WHOLE

    def read_part(self, split: str, piece: str, is_bias: bool = False) -> TensorRead:
        """What this rank reads of a tensor split `split` along `piece`'s dimension."""
        if self.size == 1 or split == "replicated":
            return WHOLE
        if split == "vocab":
            return self._vocab_rows()
        start, end = self._piece_range(piece)
        if split == "column":
            return TensorRead(rows=(start, end))
        if split == "row":
            if is_bias:  # added once, after the all-reduce
                return WHOLE if self.rank == 0 else TensorRead(zeros=True)
            return TensorRead(cols=(start, end))
        raise ValueError(f"unknown split {split!r}; known: {', '.join(SPLITS)}")

    def piece_width(self, piece: str) -> int:
        """This rank's width of `piece`'s split dimension: its query (`q`, `o`) or KV heads'
        features, its share of the MLP's (or each expert's) intermediate features."""
        start, end = self._piece_range(piece)
        return end - start

    def _vocab_rows(self) -> TensorRead:
        end = min(self.config.vocab_size, self.vocab_start + self.vocab_per_rank)
        return TensorRead(rows=(self.vocab_start, end), pad_rows=self.vocab_per_rank)

    def _piece_range(self, piece: str) -> tuple[int, int]:
        """This rank's range of `piece`'s split dimension in the full checkpoint tensor."""
        d = self.config.head_dim
        if piece in ("q", "o"):
            return self.rank * self.heads * d, (self.rank + 1) * self.heads * d
        if piece in ("k", "v"):
            return self.kv_head_start * d, (self.kv_head_start + self.kv_heads) * d
        if piece in ("gate", "up", "down"):
            return self.rank * self.intermediate, (self.rank + 1) * self.intermediate
        if piece in ("expert_gate", "expert_up", "expert_down"):
            width = self.expert_intermediate
            return self.rank * width, (self.rank + 1) * width
        raise ValueError(f"piece {piece!r} has no split dimension; known: {', '.join(PIECES[1:])}")


LlamaShard = ModelShard  # the name before the registry; kept for callers


def tensor_parallel_problem(
    tp: int, nnodes: int, config: ModelConfig, device: str, visible_gpus: int
) -> str | None:
    """Why the model cannot be split `tp` ways here (one line), or None."""
    if tp == 1:
        return None
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    flag = f"--tensor-parallel-size {tp}"
    if heads % tp:
        return f"{flag} does not divide the model's {heads} attention heads"
    if kv % tp and tp % kv:
        return (
            f"{flag} and the model's {kv} KV heads: one must divide the other "
            "(KV heads are split across ranks, or replicated when there are fewer than ranks)"
        )
    if config.intermediate_size % tp:
        return f"{flag} does not divide the model's MLP width {config.intermediate_size}"
    if config.moe is not None and config.moe.intermediate_size % tp:
        return f"{flag} does not divide the model's expert width {config.moe.intermediate_size}"
    per_node = tp // nnodes
    if device.startswith("cuda") and per_node > visible_gpus:
        return (
            f"{flag} needs {per_node} GPUs on this node but {visible_gpus} "
            f"{'is' if visible_gpus == 1 else 'are'} visible"
        )
    return None
