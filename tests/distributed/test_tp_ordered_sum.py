"""`--enable-deterministic-inference` under tensor parallelism: an all-reduce adds the ranks'
values in rank order, so an element's sum does not depend on the message it travels in
(its size, its position). Three ranks (two need nothing: a + b == b + a), bf16, gloo."""

from __future__ import annotations

from pathlib import Path

import torch
from tp_ranks import run_ranks

from sluice.runtime.distributed.group import ProcessGroup

SIZES = (7, 1000, 70_000)


def _values(rank: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + rank)
    return (torch.randn(70_000, generator=g) * 10 ** (rank - 1)).bfloat16()[:n]


def _reduce_all_sizes(tp: ProcessGroup, out: Path) -> None:
    ordered = ProcessGroup(**{**tp.__dict__, "ordered_sum": True})
    results = [ordered.all_reduce(_values(tp.rank, n).clone()) for n in SIZES]
    if tp.rank == 0:
        torch.save(results, out)


def test_every_element_is_summed_in_rank_order_whatever_the_message(tmp_path: Path) -> None:
    out = tmp_path / "sums.pt"
    run_ranks(_reduce_all_sizes, 3, out)
    results = torch.load(out)
    for n, got in zip(SIZES, results, strict=True):
        want = _values(0, n).clone()
        for rank in (1, 2):
            want += _values(rank, n)
        assert torch.equal(got, want), f"message of {n}"
        assert torch.equal(got, results[-1][:n])  # the same bits in every message size
