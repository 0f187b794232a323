"""A step's host-side inputs, staged in one upload (`memory/staging.py`), and the
`ForwardBatch` built from them with device indexing only.

Everything the device needs to know for one forward comes from the `ForwardInput` (host
lists): the table writes (new KV slots and token ids), the flat token rows and positions,
the per-request lengths, the prompt-logprob indices, and for the sampled rows their table
rows, the position their token goes to and their sampling parameters. `stage_step` packs
them; `forward_batch_of` and the worker's sampling read the device views. Nothing here
reads a device value on the host.
"""

from __future__ import annotations

import torch

from sluice.runtime.engine.forward_input import ForwardInput, RowInput
from sluice.runtime.engine.sampler import stage_sampling
from sluice.runtime.forward import ForwardBatch, ForwardMode, WindowKV
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.memory.staging import Staged, Staging


def _table_writes(
    stage: Staging, name: str, rows: list[RowInput], start_of: str, values_of: str
) -> None:
    index_rows: list[int] = []
    index_pos: list[int] = []
    values: list[int] = []
    for r in rows:
        vals = getattr(r, values_of)
        if vals:
            start = getattr(r, start_of)
            index_rows += [r.row] * len(vals)
            index_pos += range(start, start + len(vals))
            values += vals
    stage.add(f"{name}.rows", index_rows)
    stage.add(f"{name}.pos", index_pos)
    stage.add(f"{name}.values", values, torch.int32)


def next_positions(fi: ForwardInput) -> list[int]:
    """Where each sampled row's token goes in the token table."""
    return [r.start + r.length for r in fi.rows if r.sample]


def stage_step(fi: ForwardInput, vocab: int, with_sampling: bool) -> Staging:
    """Every host value of the forward `fi` (and, `with_sampling`, of its sampling)."""
    stage = Staging()
    _table_writes(stage, "slots", fi.rows, "slot_start", "slots")
    if any(r.window_slots for r in fi.rows):  # a window pool (`write_tables`)
        _table_writes(stage, "window_slots", fi.rows, "slot_start", "window_slots")
    _table_writes(stage, "tokens", fi.rows, "token_start", "tokens")
    token_rows: list[int] = []
    positions: list[int] = []
    extra: list[int] = []  # token indices whose logits give prompt logprobs
    for r in fi.rows:
        if r.logprob_targets:
            first = len(positions) + r.logprob_start - r.start
            extra += range(first, first + len(r.logprob_targets))
        token_rows += [r.row] * r.length
        positions += range(r.start, r.start + r.length)
    starts = [r.start for r in fi.rows]
    lens = [r.length for r in fi.rows]
    stage.add("token_rows", token_rows)
    stage.add("positions", positions)
    stage.add("req_rows", [r.row for r in fi.rows])
    stage.add("seq_lens", [s + n for s, n in zip(starts, lens, strict=True)])
    stage.add("prefix_lens", starts)
    stage.add("extend_lens", lens)
    stage.add("extra", extra)
    stage.add("logprob_targets", [t for r in fi.rows for t in r.logprob_targets])
    stage.add("sample_index", [i for i, r in enumerate(fi.rows) if r.sample])
    stage.add("sample_rows", [r.row for r in fi.rows if r.sample])
    next_pos = next_positions(fi)
    stage.add("next_pos", next_pos)
    if with_sampling and fi.sampling:
        stage_sampling(stage, fi.sampling, vocab, next_pos)
    return stage


def write_tables(
    staged: Staged,
    req_to_token: torch.Tensor,
    token_table: torch.Tensor,
    window: WindowKV | None = None,
) -> None:
    """The rows' new KV slots and token ids into the worker's tables (device indexing)."""
    tables = [("slots", req_to_token), ("tokens", token_table)]
    if window is not None and "window_slots.rows" in staged:
        tables.append(("window_slots", window.req_to_token))
    for name, table in tables:
        if staged.host(f"{name}.rows").numel():
            table[staged[f"{name}.rows"], staged[f"{name}.pos"]] = staged[f"{name}.values"]


def forward_batch_of(
    fi: ForwardInput,
    staged: Staged,
    req_to_token: torch.Tensor,
    token_table: torch.Tensor,
    kv: KVBuffers,
    window: WindowKV | None = None,
) -> ForwardBatch:
    """The model's description of `fi`, its tensors views of the staged upload; with a
    window pool, `window` is the same batch as the sliding layers see it."""
    rows_t, pos_t = staged["token_rows"], staged["positions"]
    starts = [r.start for r in fi.rows]
    lens = [r.length for r in fi.rows]
    has_extra = any(r.logprob_targets for r in fi.rows)
    batch = ForwardBatch(
        mode=ForwardMode.DECODE if all(n == 1 for n in lens) else ForwardMode.EXTEND,
        input_ids=token_table[rows_t, pos_t].to(torch.int64),
        positions=pos_t,
        out_cache_loc=req_to_token[rows_t, pos_t].to(torch.int64),
        req_pool_indices=staged["req_rows"],
        seq_lens=staged["seq_lens"],
        prefix_lens=staged["prefix_lens"],
        extend_lens=staged["extend_lens"],
        seq_lens_cpu=[s + n for s, n in zip(starts, lens, strict=True)],
        prefix_lens_cpu=starts,
        extend_lens_cpu=lens,
        req_to_token=req_to_token,
        kv=kv,
        extra_logit_indices=staged["extra"] if has_extra else None,
    )
    if window is None:
        return batch
    return window.attach_view(batch, window.req_to_token[rows_t, pos_t].to(torch.int64))
