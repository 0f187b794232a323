"""FlashInfer's page-table metadata, built on the CPU, names exactly the KV slots the torch
backend gathers for the same batch."""

from __future__ import annotations

import pytest
import torch
from paged_batch import make_case

from sluice.runtime.attention.flashinfer import paged_kv_layout, paged_view, qo_indptr
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardMode


def slots_from_layout(layout, seq_lens: list[int], page_size: int) -> list[list[int]]:
    """Each request's slots as FlashInfer reads them: token p of request i is offset
    p % page_size of page indices[indptr[i] + p // page_size]."""
    indptr, indices = layout.indptr.tolist(), layout.indices.tolist()
    out = []
    for i, n in enumerate(seq_lens):
        pages = indices[indptr[i] : indptr[i + 1]]
        assert len(pages) == -(-n // page_size)
        last = layout.last_page_len[i].item()
        assert (len(pages) - 1) * page_size + last == n  # the last page holds the rest
        out.append([pages[p // page_size] * page_size + p % page_size for p in range(n)])
    return out


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_layout_matches_the_torch_backends_gather(page_size: int) -> None:
    prefixes = [69, 0, 15, 16, 31, 32]  # lengths on, just past and just before page edges
    case = make_case(ForwardMode.DECODE, prefixes, [1] * len(prefixes), num_heads=4,
                     num_kv_heads=2, page_size=page_size, seed=page_size)  # fmt: skip
    b = case.batch
    layout = paged_kv_layout(b.req_to_token, b.req_pool_indices, b.seq_lens_cpu, page_size)
    assert layout.indptr.dtype == layout.indices.dtype == layout.last_page_len.dtype == torch.int32
    torch_meta = TorchAttentionBackend._decode_metadata(b)
    gathered = torch_meta.slots.view(b.batch_size, torch_meta.max_len)
    for i, slots in enumerate(slots_from_layout(layout, b.seq_lens_cpu, page_size)):
        assert slots == gathered[i, : b.seq_lens_cpu[i]].tolist()


@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_layout_and_query_offsets_match_the_torch_backend(page_size: int) -> None:
    case = make_case(ForwardMode.EXTEND, [0, 16, 40, 3], [37, 3, 20, 1], num_heads=4,
                     num_kv_heads=2, page_size=page_size, seed=7)  # fmt: skip
    b = case.batch
    layout = paged_kv_layout(b.req_to_token, b.req_pool_indices, b.seq_lens_cpu, page_size)
    requests = TorchAttentionBackend._extend_metadata(b)
    for req, slots in zip(requests, slots_from_layout(layout, b.seq_lens_cpu, page_size),
                          strict=True):  # fmt: skip
        assert slots == req.slots.tolist()
    assert qo_indptr(b.extend_lens_cpu, "cpu").tolist() == [0] + [r.end for r in requests]


def test_paged_view_puts_slot_s_at_page_s_div_p_offset_s_mod_p() -> None:
    cache = torch.arange(64 * 2 * 4, dtype=torch.float32).view(64, 2, 4)
    pages = paged_view(cache, 16)
    assert pages.shape == (4, 16, 2, 4)
    for slot in (0, 15, 16, 37, 63):
        assert torch.equal(pages[slot // 16, slot % 16], cache[slot])
