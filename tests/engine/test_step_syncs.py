"""The hot path makes no transfer that waits for the device: what the scheduler thread
enqueues for one step (`ModelWorker.launch` + `ModelWorker.sample`, as the overlap loop's
stream executor calls them) is counted by tests/sync_recorder.py, a CUDA stand-in on the
CPU. The reading of the sampled tokens (`collect`) is the one wait by design and is not
part of the step.

Covered: greedy and sampled decode steps, a mixed prefill/decode step, logprobs with top-k
alternatives, and a step of LoRA adapter rows beside base-model rows (the experts of MoE
layers: tests/model/test_expert_syncs.py).

The attention backend runs paused (the torch reference backend is not the GPU's; the
FlashInfer backend's metadata is counted in tests/attention/test_flashinfer_plan_syncs.py,
Triton's has no host read by construction).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from sync_recorder import SyncRecorder, recording

from sluice.runtime.engine.forward_input import ForwardInput, RowInput, SamplingInput
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.server_args import ServerArgs

PROMPT = [5, 17, 42, 7, 99, 3, 11]
ROWS = 4
SLOT_BASE = 64  # row r's KV slots start at SLOT_BASE * (r + 1) (page 0 is reserved)


class _PausedBackend:
    """The model's attention backend, its work not looked at by the recorder."""

    def __init__(self, inner: object, recorder: list[SyncRecorder | None]) -> None:
        self._inner = inner
        self._recorder = recorder

    def __getattr__(self, name: str) -> object:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def call(*args: object, **kwargs: object) -> object:
            rec = self._recorder[0]
            if rec is None:
                return attr(*args, **kwargs)
            with rec.paused():
                return attr(*args, **kwargs)

        return call


@pytest.fixture(scope="module")
def worker(tiny_llama_path: Path) -> tuple[ModelWorker, list[SyncRecorder | None]]:
    args = dataclasses.replace(
        ServerArgs(model=str(tiny_llama_path)), device="cpu", dtype="float32",
        attention_backend="torch", max_total_tokens=1024, max_running_requests=8,
    )  # fmt: skip
    w = ModelWorker(args, tiny_llama_path)
    current: list[SyncRecorder | None] = [None]
    w.model.attn_backend = _PausedBackend(w.model.attn_backend, current)
    return w, current


def _prefill(row: int, sample: bool = True) -> RowInput:
    n = len(PROMPT)
    slots = list(range(SLOT_BASE * (row + 1), SLOT_BASE * (row + 1) + n))
    return RowInput(row, 0, n, 0, slots, 0, PROMPT, sample)


def _decode(row: int, start: int) -> RowInput:
    return RowInput(row, start, 1, start, [SLOT_BASE * (row + 1) + start], start, [], True)


def _sampling(params: SamplingParams, seed: int) -> SamplingInput:
    return SamplingInput(params, len(PROMPT), torch.Generator().manual_seed(seed))


GREEDY = SamplingParams(temperature=0.0)
SAMPLED = [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=0.8, top_k=20, min_p=0.05),
    SamplingParams(temperature=1.1, repetition_penalty=1.2, frequency_penalty=0.5,
                   presence_penalty=0.3),
]  # fmt: skip


def _step_syncs(
    worker: tuple[ModelWorker, list[SyncRecorder | None]], fi: ForwardInput
) -> SyncRecorder:
    w, current = worker
    with recording() as rec:
        current[0] = rec
        try:
            launched = w.launch(fi)
            w.sample(launched, None)
        finally:
            current[0] = None
    return rec


def _prefilled(worker: tuple[ModelWorker, list[SyncRecorder | None]], params: list[SamplingParams]) -> None:
    w, _ = worker
    rows = [_prefill(r) for r in range(len(params))]
    w.run(ForwardInput(rows, [_sampling(p, r) for r, p in enumerate(params)]))


def test_a_greedy_decode_step_waits_for_nothing(worker):
    _prefilled(worker, [GREEDY] * ROWS)
    fi = ForwardInput([_decode(r, len(PROMPT)) for r in range(ROWS)],
                      [_sampling(GREEDY, r) for r in range(ROWS)])  # fmt: skip
    rec = _step_syncs(worker, fi)
    assert rec.events == [], rec.counts()


def test_a_decode_step_of_sampled_rows_with_top_p_top_k_min_p_and_penalties_waits_for_nothing(worker):
    _prefilled(worker, SAMPLED)
    fi = ForwardInput([_decode(r, len(PROMPT)) for r in range(ROWS)],
                      [_sampling(p, r) for r, p in enumerate(SAMPLED)])  # fmt: skip
    rec = _step_syncs(worker, fi)
    assert rec.events == [], rec.counts()


def test_a_mixed_step_of_prefill_and_sampled_decode_rows_waits_for_nothing(worker):
    _prefilled(worker, SAMPLED[:2])
    rows = [_decode(0, len(PROMPT)), _decode(1, len(PROMPT)), _prefill(2), _prefill(3)]
    params = [GREEDY, SAMPLED[1], SAMPLED[2], SAMPLED[3]]
    fi = ForwardInput(rows, [_sampling(p, r) for r, p in enumerate(params)])
    rec = _step_syncs(worker, fi)
    assert rec.events == [], rec.counts()


def test_the_recorder_sees_the_transfers_that_wait():
    """The stand-in is not blind: the patterns the hot path avoids are each recorded."""
    device_t = torch.arange(8)  # made before recording: a device tensor
    with recording() as rec:
        device_t.tolist()
        device_t[[1, 2]]
        torch.tensor([1, 2], device="cpu")
        torch.tensor([1, 2]).to("cpu", non_blocking=True)  # pageable
        device_t[device_t > 3]
        int(device_t[0])
    assert rec.count == 6, rec.counts()
    with recording() as rec:
        from sluice.runtime.memory.staging import Staging

        stage = Staging()
        stage.add("a", [1, 2, 3])
        staged = stage.upload("cpu")
        device_t[staged["a"]]  # device index: no copy
    assert rec.events == [], rec.counts()


def test_a_decode_step_with_top_logprobs_waits_for_nothing(worker):
    """The chosen token's logprob and the top-k alternatives stay on the device until the
    tokens are collected."""
    with_logprobs = [SamplingParams(temperature=0.0, logprobs=True, top_logprobs_num=5),
                     SamplingParams(temperature=0.7, logprobs=True)]  # fmt: skip
    _prefilled(worker, with_logprobs)
    fi = ForwardInput([_decode(r, len(PROMPT)) for r in range(2)],
                      [_sampling(p, r) for r, p in enumerate(with_logprobs)])  # fmt: skip
    rec = _step_syncs(worker, fi)
    assert rec.events == [], rec.counts()


@pytest.fixture(scope="module")
def lora_worker(tiny_llama_path: Path, tmp_path_factory) -> tuple[ModelWorker, list[SyncRecorder | None]]:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lora_adapters import make_adapter

    adapter = make_adapter(tiny_llama_path, tmp_path_factory.mktemp("adapter") / "a", rank=4)
    args = dataclasses.replace(
        ServerArgs(model=str(tiny_llama_path)), device="cpu", dtype="float32",
        attention_backend="torch", max_total_tokens=1024, max_running_requests=8,
        enable_lora=True, lora_modules=(f"a={adapter}",),
    )  # fmt: skip
    w = ModelWorker(args, tiny_llama_path)
    current: list[SyncRecorder | None] = [None]
    w.model.attn_backend = _PausedBackend(w.model.attn_backend, current)
    return w, current


def test_a_decode_step_of_adapter_and_base_rows_waits_for_nothing(lora_worker):
    """The batch's adapter segments are built on the host and uploaded without a wait."""
    w, _ = lora_worker
    rows = [dataclasses.replace(_prefill(r), lora=1 if r % 2 else 0) for r in range(ROWS)]
    w.run(ForwardInput(rows, [_sampling(GREEDY, r) for r in range(ROWS)]))
    decode = [dataclasses.replace(_decode(r, len(PROMPT)), lora=1 if r % 2 else 0) for r in range(ROWS)]
    fi = ForwardInput(decode, [_sampling(GREEDY, r) for r in range(ROWS)])
    rec = _step_syncs(lora_worker, fi)
    assert rec.events == [], rec.counts()


def test_a_decode_step_under_a_grammar_mask_waits_for_nothing(worker):
    """The scheduler's token bitmask (pinned host memory) is copied without a wait and
    applied to every sampled row."""
    from sluice.runtime.constrained import allocate_token_bitmask

    w, current = worker
    _prefilled(worker, [GREEDY] * ROWS)
    fi = ForwardInput([_decode(r, len(PROMPT)) for r in range(ROWS)],
                      [_sampling(GREEDY, r) for r in range(ROWS)])  # fmt: skip
    with recording() as rec:
        mask = allocate_token_bitmask(ROWS, w.model.config.vocab_size)  # the scheduler's
        mask[:, 0] = 0b1000  # every row may take token 3 only
        mask[:, 1:] = 0
        current[0] = rec
        try:
            sampled = w.sample(w.launch(fi), mask)
        finally:
            current[0] = None
    assert rec.events == [], rec.counts()
    assert w.collect(sampled).token_ids == [3] * ROWS
