"""What a forward costs depends on: the few numbers of a `ForwardInput` the step-time model
reads (`BatchFeatures`).

A decode row computes one position and sends no token (its input is on the device); every
other row is a prefill row (a prompt, a chunk of one, or a re-prefill after a retraction)
that computes `length` positions after `start` cached ones. Mixed batches (decode rows
plus a prefill chunk in one forward) are just both kinds at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from sluice.runtime.engine.forward_input import ForwardInput, RowInput


def is_decode_row(row: RowInput) -> bool:
    return row.length == 1 and not row.tokens


@dataclass(frozen=True)
class BatchFeatures:
    decode_rows: int = 0
    decode_context: int = 0  # sum over decode rows of the positions attended (start + 1)
    prefill_rows: int = 0
    prefill_tokens: int = 0  # positions computed by prefill rows
    # query-key pairs of the prefill rows, in thousands: each new position attends to the
    # cached prefix and to the new positions up to itself
    prefill_attention_k: float = 0.0
    sampled_rows: int = 0

    @classmethod
    def of(cls, fi: ForwardInput) -> BatchFeatures:
        decode_rows = decode_context = prefill_rows = prefill_tokens = 0
        pairs = 0.0
        for r in fi.rows:
            if is_decode_row(r):
                decode_rows += 1
                decode_context += r.start + 1
            else:
                prefill_rows += 1
                prefill_tokens += r.length
                pairs += r.length * (r.start + (r.length + 1) / 2)
        return cls(
            decode_rows=decode_rows,
            decode_context=decode_context,
            prefill_rows=prefill_rows,
            prefill_tokens=prefill_tokens,
            prefill_attention_k=pairs / 1000.0,
            sampled_rows=len(fi.sampling),
        )

    @property
    def rows(self) -> int:
        return self.decode_rows + self.prefill_rows

    @property
    def tokens(self) -> int:
        """Positions the model computes: what the GEMMs scale with."""
        return self.decode_rows + self.prefill_tokens

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> BatchFeatures:
        """The features a record holds under `to_dict`'s keys (a schedule trace's forward
        line, a calibration point); other keys are ignored."""
        return cls(**{f.name: record[f.name] for f in fields(cls)})
