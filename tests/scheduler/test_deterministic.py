"""--enable-deterministic-inference: a request's tokens do not depend on its batch, in fp32
(torch GEMMs on padded row counts, the torch batch-invariant attention) and in bf16 (the
compiled CPU kernels, row-invariant by construction); each dtype forced, never `auto`."""

from __future__ import annotations

import random

import pytest

PROMPTS = [[5 + (i * 13 + j * 7) % 180 for j in range(6 + (i * 5) % 37)] for i in range(32)]
NEW = 20


def run_all(h, order, **sampling):
    for i in order:
        h.submit(f"p{i}", PROMPTS[i], max_new_tokens=NEW, ignore_eos=True, **sampling)
    h.run_until_idle()
    return {i: h.outputs[f"p{i}"] for i in order}


_ALONE: dict[str, dict[int, list[int]]] = {}


@pytest.fixture(params=["float32", "bfloat16"])
def deterministic(request, make_harness):
    """A harness factory in deterministic mode and the given dtype."""

    def make(**overrides):
        return make_harness(enable_deterministic_inference=True, dtype=request.param, **overrides)

    make.dtype = request.param
    return make


@pytest.fixture
def alone(deterministic):
    """Each prompt run on its own (computed once per module and dtype)."""
    if deterministic.dtype not in _ALONE:
        h = deterministic(disable_radix_cache=True)
        _ALONE[deterministic.dtype] = {}
        for i in range(len(PROMPTS)):
            _ALONE[deterministic.dtype].update(run_all(h, [i]))
    return _ALONE[deterministic.dtype]


def test_batch_of_32_in_any_order_matches_alone(deterministic, alone):
    order = list(range(32))
    random.Random(7).shuffle(order)
    h = deterministic(max_running_requests=32)
    assert run_all(h, order) == alone


def test_chunked_prefill_matches_alone(deterministic, alone):
    h = deterministic(chunked_prefill_size=8, max_prefill_tokens=8)
    assert run_all(h, range(32)) == alone


def test_retraction_under_a_tiny_pool_matches_alone(deterministic, alone):
    h = deterministic(max_total_tokens=256, max_running_requests=16)
    assert run_all(h, range(32)) == alone
    assert h.scheduler.counters.retractions_total > 0


def test_the_overlap_loop_matches_alone(deterministic, alone):
    h = deterministic(max_running_requests=32, disable_overlap_schedule=False)
    assert run_all(h, range(32)) == alone


def test_bf16_runs_the_compiled_kernels_unpadded(deterministic):
    h = deterministic()
    expected = "cpu" if deterministic.dtype == "bfloat16" else "batch-invariant"
    assert h.worker.attention_backend_name == expected


def test_seeded_sampling_is_reproducible_across_batches(deterministic):
    params = dict(temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    solo = deterministic()
    first = run_all(solo, [3], **params)[3]
    crowd = deterministic(max_total_tokens=256, max_running_requests=16)
    for i in range(32):
        if i != 3:
            crowd.submit(f"p{i}", PROMPTS[i], max_new_tokens=NEW, ignore_eos=True)
    assert run_all(crowd, [3], **params)[3] == first


def test_bf16_refuses_to_start_without_the_compiled_kernels(make_harness, monkeypatch):
    from sluice.runtime.kernels import cpu_extension

    monkeypatch.setattr(cpu_extension, "load", lambda: "no C++ compiler on PATH")
    with pytest.raises(RuntimeError, match="needs the compiled CPU kernels .no C.. compiler"):
        make_harness(enable_deterministic_inference=True, dtype="bfloat16")
