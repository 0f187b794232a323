"""Batched LoRA matmuls over a mixed batch: `y[t] += s[slot] * (x[t] @ A[slot].T) @ B[slot].T`
for each token t whose request uses the adapter in `slot` (base-model tokens are left alone).

The adapters of a batch sit in device slots: `A [S, R, in]`, `B [S, out, R]`, zero beyond
each adapter's own rank, and `scaling [S]`. A batch's tokens are described by `Segments`:
runs of consecutive tokens with one adapter (a request's tokens are consecutive, so a
segment is one or more requests). Two implementations:

- `lora_torch`: the CPU path. Tokens are gathered per adapter (one `index_select`, two
  matmuls at the adapter's own rank, one `index_add_`), so each adapter costs two small
  GEMMs whatever its requests' positions in the batch.
- `lora_triton` (`triton_sgmv.py`): SGMV, one program per (segment, token block[, output
  block]) with `tl.dot` on the segment's adapter, for the GPU (tested on the CPU under
  `TRITON_INTERPRET=1`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sluice.runtime.memory.staging import Staging


@dataclass(frozen=True)
class Segments:
    """Runs of tokens with one adapter. `starts/lens/slots` are host lists (torch path, and
    the launch grid); `*_t` the same as int32 device tensors (the Triton kernels).
    `groups`: per slot used, its token indices (int64, on the device) and the adapter's rank."""

    starts: list[int]
    lens: list[int]
    slots: list[int]
    groups: list[tuple[int, int, torch.Tensor | slice]]
    starts_t: torch.Tensor | None = None
    lens_t: torch.Tensor | None = None
    slots_t: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return bool(self.slots)

    @property
    def max_len(self) -> int:
        return max(self.lens) if self.lens else 0


def build_segments(
    token_slots: list[tuple[int, int]], ranks: list[int], device: torch.device | str
) -> Segments:
    """`token_slots`: per request row in batch order, (tokens, slot or -1 for the base
    model). Segments list only adapter tokens."""
    starts: list[int] = []
    lens: list[int] = []
    slots: list[int] = []
    at = 0
    for n, slot in token_slots:
        if slot >= 0 and n > 0:
            if slots and slots[-1] == slot and starts[-1] + lens[-1] == at:
                lens[-1] += n
            else:
                starts.append(at)
                lens.append(n)
                slots.append(slot)
        at += n
    by_slot: dict[int, list[int]] = {}
    for s, n, slot in zip(starts, lens, slots, strict=True):
        by_slot.setdefault(slot, []).extend(range(s, s + n))
    if not slots:
        return Segments(starts, lens, slots, [])
    # every host value in one staged copy (pinned, non-blocking: the host never waits)
    stage = Staging()
    stage.add("starts", starts, torch.int32)
    stage.add("lens", lens, torch.int32)
    stage.add("slots", slots, torch.int32)
    for slot, idx in by_slot.items():
        if idx[-1] - idx[0] + 1 != len(idx):
            stage.add(f"idx{slot}", idx)
    staged = stage.upload(device)
    groups: list[tuple[int, int, torch.Tensor | slice]] = []
    for slot, idx in by_slot.items():
        if idx[-1] - idx[0] + 1 == len(idx):  # one contiguous run: a slice, no gather
            groups.append((slot, ranks[slot], slice(idx[0], idx[-1] + 1)))
        else:
            groups.append((slot, ranks[slot], staged[f"idx{slot}"]))
    return Segments(starts, lens, slots, groups, staged["starts"], staged["lens"], staged["slots"])


def lora_torch(
    y: torch.Tensor,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scaling: list[float],
    seg: Segments,
) -> None:
    """Add the LoRA term to `y [T, out]` in place (the torch path)."""
    for slot, rank, idx in seg.groups:
        xs = x[idx]
        h = xs @ a[slot, :rank].T
        delta = (h @ b[slot, :, :rank].T) * scaling[slot]
        if isinstance(idx, slice):
            y[idx] += delta.to(y.dtype)
        else:
            y.index_add_(0, idx, delta.to(y.dtype))
