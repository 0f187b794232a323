"""Which part of each weight a tensor-parallel rank holds (Megatron-LM's layout).

- column-parallel (output rows split): q/k/v and gate/up; each rank computes its own heads
  and its own share of the MLP's intermediate features, with no communication;
- row-parallel (input columns split): o and down; each rank's partial sums are added by an
  all-reduce (their biases are added once: rank 0 holds them, the others hold zeros);
- vocab-parallel: the embedding and the LM head hold `ceil(vocab / tp)` rows each (the last
  rank's missing rows are zero padding); the embedding's lookups are all-reduced, the
  logits all-gathered;
- KV heads are split when `num_kv_heads >= tp`, else replicated: rank r holds KV head
  `r * num_kv_heads // tp`, the one its query heads attend to.

`LlamaShard.read` says what to read of each checkpoint tensor, so a rank reads only its
slices (safetensors' `get_slice`) instead of loading whole tensors and cutting them.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from sluice.runtime.model.config import ModelConfig

_COLUMN = re.compile(r"\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
_ROW = re.compile(r"\.(o_proj|down_proj)\.(weight|bias)$")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


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
class LlamaShard:
    """Rank `rank` of `size` of a Llama-family model described by `config`."""

    config: ModelConfig
    rank: int = 0
    size: int = 1

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
    def vocab_per_rank(self) -> int:
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab_start(self) -> int:
        return self.rank * self.vocab_per_rank

    def local_config(self) -> ModelConfig:
        """The shapes this rank builds: its heads, its MLP share and its vocab rows."""
        if self.size == 1:
            return self.config
        return dataclasses.replace(
            self.config,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            intermediate_size=self.intermediate,
            vocab_size=self.vocab_per_rank,
        )

    def read(self, name: str) -> TensorRead:
        """What this rank reads of the checkpoint tensor `name` (a Hugging Face name)."""
        if self.size == 1:
            return WHOLE
        if name in _VOCAB:
            end = min(self.config.vocab_size, self.vocab_start + self.vocab_per_rank)
            return TensorRead(rows=(self.vocab_start, end), pad_rows=self.vocab_per_rank)
        if (m := _COLUMN.search(name)) is not None:
            return TensorRead(rows=self._column_rows(m.group(1)))
        if (m := _ROW.search(name)) is not None:
            if m.group(2) == "bias":  # added once, after the all-reduce
                return WHOLE if self.rank == 0 else TensorRead(zeros=True)
            width = self.heads * self.config.head_dim if m.group(1) == "o_proj" else self.intermediate
            return TensorRead(cols=(self.rank * width, (self.rank + 1) * width))
        return WHOLE  # norms: replicated

    def _column_rows(self, projection: str) -> tuple[int, int]:
        d = self.config.head_dim
        if projection == "q_proj":
            return self.rank * self.heads * d, (self.rank + 1) * self.heads * d
        if projection in ("k_proj", "v_proj"):
            return self.kv_head_start * d, (self.kv_head_start + self.kv_heads) * d
        return self.rank * self.intermediate, (self.rank + 1) * self.intermediate
