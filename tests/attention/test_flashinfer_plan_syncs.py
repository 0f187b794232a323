"""FlashInfer is planned from host-side lengths: no transfer that waits for the device,
counted by tests/sync_recorder.py with a stand-in `flashinfer` module whose wrappers do
what FlashInfer's `plan` does with its arguments (FlashInfer 0.6: `indptr.to("cpu")`,
`last_page_len.to("cpu")`, and `qo_indptr.to("cpu")` for prefill; a device tensor there is
a device-to-host copy that waits for the stream, a host tensor a no-op)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from paged_batch import make_case
from sync_recorder import recording

from sluice.runtime.forward import ForwardMode


class _Wrapper:
    planned: list[dict[str, torch.Tensor]] = []

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.kwargs = kwargs

    def _host(self, **named: torch.Tensor) -> None:
        # what FlashInfer's plan does: read the lengths on the host
        _Wrapper.planned.append({name: t.cpu() for name, t in named.items()})

    def run(self, q: torch.Tensor, cache: object) -> torch.Tensor:
        return torch.zeros_like(q)


class _Decode(_Wrapper):
    def plan(self, indptr, indices, last_page_len, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        self._host(indptr=indptr, last_page_len=last_page_len)


class _Prefill(_Wrapper):
    def plan(self, qo_indptr, indptr, indices, last_page_len, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        self._host(qo_indptr=qo_indptr, indptr=indptr, last_page_len=last_page_len)


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch):
    fake = types.ModuleType("flashinfer")
    fake.BatchDecodeWithPagedKVCacheWrapper = _Decode  # type: ignore[attr-defined]
    fake.BatchPrefillWithPagedKVCacheWrapper = _Prefill  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    from sluice.runtime.attention.flashinfer import FlashInferAttentionBackend

    _Wrapper.planned.clear()
    return FlashInferAttentionBackend(page_size=4, device="cpu", workspace_bytes=64)


def _forward_syncs(backend, mode: ForwardMode, prefixes: list[int], extends: list[int]):  # noqa: ANN001, ANN202
    case = make_case(mode, prefixes, extends, num_heads=4, num_kv_heads=2, page_size=4)
    b = case.batch
    backend.init_forward_metadata(b)  # the first forward learns the head shapes
    backend.forward(case.q, case.k, case.v, 0, b)
    with recording() as rec:
        backend.init_forward_metadata(b)
        for _ in range(2):  # every layer
            backend.forward(case.q, case.k, case.v, 0, b)
    return rec, b


def test_a_decode_plan_reads_nothing_from_the_device(backend):
    rec, b = _forward_syncs(backend, ForwardMode.DECODE, [5, 9, 16, 30], [1, 1, 1, 1])
    assert rec.events == [], rec.counts()
    planned = _Wrapper.planned[-1]  # and what it was given is right
    pages = [-(-n // 4) for n in b.seq_lens_cpu]
    assert planned["indptr"].tolist() == [0, *torch.tensor(pages).cumsum(0).tolist()]
    assert planned["last_page_len"].tolist() == [(n - 1) % 4 + 1 for n in b.seq_lens_cpu]


def test_a_mixed_prefill_plan_reads_nothing_from_the_device(backend):
    rec, b = _forward_syncs(backend, ForwardMode.EXTEND, [0, 7, 12, 3], [6, 1, 4, 1])
    assert rec.events == [], rec.counts()
    assert _Wrapper.planned[-1]["qo_indptr"].tolist() == [0, 6, 7, 11, 12]
