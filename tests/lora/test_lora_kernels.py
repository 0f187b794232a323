"""The batched LoRA matmuls against a per-token reference: the torch segment path (the CPU)
and the Triton SGMV kernels (under `TRITON_INTERPRET=1` on the CPU), over mixed batches of
base-model rows and rows of several adapters of different ranks."""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.lora.ops import build_segments, lora_torch

SLOTS, R = 3, 16


def _case(fan_in: int, fan_out: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ranks = [8, 16, 4]
    a = torch.zeros(SLOTS, R, fan_in, dtype=dtype)
    b = torch.zeros(SLOTS, fan_out, R, dtype=dtype)
    for s, r in enumerate(ranks):
        a[s, :r] = torch.randn(r, fan_in, generator=g).to(dtype)
        b[s, :, :r] = torch.randn(fan_out, r, generator=g).to(dtype)
    scaling = [2.0, 0.5, 1.25]
    # rows in batch order: (tokens, slot); -1 is the base model
    rows = [(5, 0), (1, -1), (1, 1), (7, 1), (3, -1), (1, 0), (20, 2), (1, 2), (2, 0)]
    tokens = sum(n for n, _ in rows)
    x = torch.randn(tokens, fan_in, generator=g).to(dtype)
    y = torch.randn(tokens, fan_out, generator=g).to(dtype)
    return a, b, scaling, ranks, rows, x, y


def _reference(a, b, scaling, ranks, rows, x, y):
    out = y.double().clone()
    at = 0
    for n, slot in rows:
        if slot >= 0:
            r = ranks[slot]
            xs = x[at : at + n].double()
            out[at : at + n] += (
                (xs @ a[slot, :r].double().T) @ b[slot, :, :r].double().T * scaling[slot]
            )
        at += n
    return out


def test_torch_segments_match_the_per_token_reference():
    a, b, scaling, ranks, rows, x, y = _case(64, 96, torch.float32)
    want = _reference(a, b, scaling, ranks, rows, x, y)
    seg = build_segments(rows, ranks, "cpu")
    assert seg.slots == [0, 1, 0, 2, 0]  # consecutive rows of one adapter merge
    got = y.clone()
    lora_torch(got, x, a, b, scaling, seg)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    base_rows = [5, 14, 15, 16]  # tokens of the base-model rows are untouched
    assert torch.equal(got[base_rows], y[base_rows])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fan_in,fan_out", [(64, 96), (100, 40)])  # also ragged tiles
def test_triton_sgmv_matches_the_torch_path(dtype, fan_in, fan_out):
    pytest.importorskip("triton")
    from sluice.runtime.lora.triton_sgmv import lora_triton

    a, b, scaling, ranks, rows, x, y = _case(fan_in, fan_out, dtype, seed=1)
    seg = build_segments(rows, ranks, "cpu")
    want = y.clone()
    lora_torch(want, x, a, b, scaling, seg)
    got = y.clone()
    lora_triton(got, x, a, b, torch.tensor(scaling), seg)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    else:  # the kernel accumulates in fp32, the torch path rounds h to bf16: both near exact
        exact = _reference(a, b, scaling, ranks, rows, x, y)
        scale = exact.abs().max().item()
        assert (got.double() - exact).abs().max().item() < 0.02 * scale
        assert (want.double() - exact).abs().max().item() < 0.02 * scale
    base_rows = [5, 14, 15, 16]
    assert torch.equal(got[base_rows], y[base_rows])


def test_triton_sgmv_writes_into_a_column_slice_of_a_fused_output():
    pytest.importorskip("triton")
    from sluice.runtime.lora.triton_sgmv import lora_triton

    a, b, scaling, ranks, rows, x, _ = _case(64, 32, torch.float32, seed=2)
    fused = torch.randn(x.shape[0], 96)
    want = fused.clone()
    seg = build_segments(rows, ranks, "cpu")
    lora_torch(want[:, 32:64], x, a, b, scaling, seg)
    got = fused.clone()
    lora_triton(got[:, 32:64], x, a, b, torch.tensor(scaling), seg)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[:, :32], fused[:, :32]) and torch.equal(got[:, 64:], fused[:, 64:])
