"""Tensor parallelism over NCCL: two GPUs give the logits of one (skipped with fewer).

The CPU suite proves the same over gloo (tests/distributed); this is the NCCL check for a
machine with two GPUs.
"""

from __future__ import annotations

import pytest
import torch
from distributed.test_tp_logits import VARIANTS, script_logits
from gpu_support import ON_CPU
from tiny_model import make_tiny_llama
from tp_ranks import run_ranks

from sluice.runtime.distributed.group import TensorParallelGroup
from sluice.runtime.model.loader import load_model

pytestmark = pytest.mark.skipif(
    ON_CPU or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"
)


def _rank_logits(tp: TensorParallelGroup, folder, out) -> None:  # type: ignore[no-untyped-def]
    model, _ = load_model(folder, "cuda", torch.float32, "torch", tp)
    logits = script_logits(model, device="cuda")
    if tp.is_leader:
        torch.save(logits.cpu(), out)


def test_two_gpus_give_the_logits_of_one(tmp_path):
    _, overrides = VARIANTS["heads8_kv2"]
    folder = make_tiny_llama(tmp_path / "m", initializer_range=0.08, **overrides)
    run_ranks(_rank_logits, 2, folder, tmp_path / "tp2.pt", device="cuda")
    tp1 = script_logits(load_model(folder, "cuda", torch.float32, "torch")[0], device="cuda")
    tp2 = torch.load(tmp_path / "tp2.pt")
    assert (tp2 - tp1.cpu()).abs().max().item() <= 1e-4
