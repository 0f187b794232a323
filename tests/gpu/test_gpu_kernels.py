"""Triton and FlashInfer equal the torch backend on random paged batches: bf16 storage,
page sizes 1 and 16, GQA groups 1, 3 (SmolLM2) and 4, ragged decode and extend batches
with cached prefixes. The reference is the torch backend on the same values in fp32."""

from __future__ import annotations

import random

import pytest
import torch
from gpu_support import ON_CPU, backend_for
from paged_batch import make_case, run_backend, with_dtype

from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardMode

BACKENDS = ["triton", "flashinfer"]
GROUPS = [(9, 3), (32, 8), (4, 4)]  # (query heads, KV heads): groups 3, 4, 1
SCALE = 8 if ON_CPU else 1  # shapes shrink on the CPU (interpreter) check


def assert_close_to_fp32_reference(name: str, case, page_size: int) -> None:
    reference = run_backend(TorchAttentionBackend(), with_dtype(case, torch.float32))
    out = run_backend(backend_for(name, str(case.q.device), page_size), case).float()
    tol = 1e-4 if case.q.dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, reference, atol=tol, rtol=tol)
    assert (out - reference).abs().mean().item() < tol / 8


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", GROUPS)
def test_decode_ragged_batch(name, page_size, heads, kv_heads, device, dtype):
    rng = random.Random(page_size * 100 + heads)
    prefixes = [8000 // SCALE] + [rng.randint(0, 3000 // SCALE) for _ in range(36 // SCALE)]
    prefixes += [0, 1, 15, 16, 255, 256]
    case = make_case(ForwardMode.DECODE, prefixes, [1] * len(prefixes), num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=64, page_size=page_size, seed=heads,
                     dtype=dtype, device=device)  # fmt: skip
    assert_close_to_fp32_reference(name, case, page_size)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads, kv_heads", GROUPS)
def test_extend_with_cached_prefixes(name, page_size, heads, kv_heads, device, dtype):
    rng = random.Random(page_size + heads)
    n = 12 // (2 if ON_CPU else 1)
    prefixes = [0, 0] + [rng.randint(1, 2000 // SCALE) for _ in range(n - 2)]
    extends = [700 // SCALE, 1] + [rng.randint(1, 300 // SCALE) for _ in range(n - 2)]
    if page_size > 1:  # the radix cache shares whole pages: prefixes end on a page edge
        prefixes = [p // page_size * page_size for p in prefixes]
    case = make_case(ForwardMode.EXTEND, prefixes, extends, num_heads=heads,
                     num_kv_heads=kv_heads, head_dim=64, page_size=page_size,
                     seed=heads + 1, dtype=dtype, device=device)  # fmt: skip
    assert_close_to_fp32_reference(name, case, page_size)


@pytest.mark.parametrize("head_dim", [128, 96])
def test_triton_other_head_dims(head_dim, device, dtype):
    case = make_case(ForwardMode.DECODE, [300 // SCALE, 5, 77], [1, 1, 1], num_heads=8,
                     num_kv_heads=2, head_dim=head_dim, seed=head_dim, dtype=dtype,
                     device=device)  # fmt: skip
    assert_close_to_fp32_reference("triton", case, 1)
    case = make_case(ForwardMode.EXTEND, [0, 64 // SCALE], [100 // SCALE, 33], num_heads=8,
                     num_kv_heads=2, head_dim=head_dim, seed=head_dim + 1, dtype=dtype,
                     device=device)  # fmt: skip
    assert_close_to_fp32_reference("triton", case, 1)
