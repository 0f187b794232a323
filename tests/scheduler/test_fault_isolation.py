"""A forward that raises loses its batch, not the scheduler (scheduler/faults.py).

Faults are injected with the test hook (`testing/fault_injection.py`, an executor wrapper): a
prompt holding the poison token makes its forward's result raise after the model ran. What a client
would see is checked: the batch's requests end with an 'error' naming the cause, requests
outside it complete with exactly the tokens a run without faults gives them (the oracle: a
fresh scheduler without the hook), nothing the failed forward wrote is reused from the
prefix cache, and the pool's books balance.
"""

from __future__ import annotations

import pytest
import torch

from sluice.runtime.engine.engine_faults import EngineUnusable, is_unrecoverable
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.scheduler.faults import EngineDead
from sluice.runtime.testing.fault_injection import (
    ENV_FAULTS,
    FaultInjectingExecutor,
    FaultPlan,
    InjectedFatalFault,
    InjectedFault,
)

POISON = 77
PREFIX = [11, 12, 13, 14, 15, 16, 17, 18]  # two full pages of 4
# the normal loop, the overlap loop on a forward thread (the CPU's) and on the stream
# executor (the GPU's, driven through host streams)
LOOPS = pytest.mark.parametrize("loop", ["normal", "thread", "stream"])


def harness(make_harness, loop: str, **kw: object):
    h = make_harness(disable_overlap_schedule=loop == "normal", **kw)
    if loop == "stream":
        from sluice.runtime.engine.executor import HostStreams, StreamExecutor

        h.scheduler.executor.close()
        h.scheduler.executor = StreamExecutor(h.worker, HostStreams())
    return h


def inject(h, plan: FaultPlan) -> None:
    """Wrap the harness's executor as the scheduler process does for `SLUICE_TEST_FAULTS`."""
    h.scheduler.executor = FaultInjectingExecutor(h.scheduler.executor, plan)


def run_alone(make_harness, prompt: list[int], **sampling: object) -> list[int]:
    """The oracle: the tokens a scheduler without faults gives `prompt`."""
    h = make_harness(page_size=4)
    h.submit("oracle", prompt, **sampling)
    h.run_until_idle()
    return h.outputs["oracle"]


def test_fault_plan_reads_its_triggers_once_from_the_environment():
    assert FaultPlan.from_env({}) is None
    plan = FaultPlan.from_env({ENV_FAULTS: "forward_token=7, sample_seed=42,fatal_token=9"})
    assert plan == FaultPlan(forward_token=7, sample_seed=42, fatal_token=9)
    with pytest.raises(ValueError, match="forward_tokens"):
        FaultPlan.parse("forward_tokens=1")


def test_unrecoverable_faults_are_the_device_errors():
    assert is_unrecoverable(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert is_unrecoverable(RuntimeError("NCCL error: unhandled system error"))
    assert is_unrecoverable(InjectedFatalFault("x")) and is_unrecoverable(EngineUnusable("x"))
    assert not is_unrecoverable(InjectedFault("x"))
    assert not is_unrecoverable(IndexError("index 700 is out of bounds for dimension 1"))
    assert not is_unrecoverable(ValueError("bad"))


def test_with_tensor_parallelism_any_forward_fault_is_unrecoverable():
    """A rank that drops a batch alone leaves the other ranks waiting in a collective."""
    from types import SimpleNamespace

    from sluice.runtime.engine.model_worker import ModelWorker

    for size, expect_fatal in ((1, False), (2, True)):
        worker = SimpleNamespace(tp=SimpleNamespace(size=size, rank=1))
        with pytest.raises(Exception) as caught:
            with ModelWorker._faults_of_the_group(worker):  # type: ignore[arg-type]
                raise InjectedFault("sampler failed")
        assert is_unrecoverable(caught.value) is expect_fatal
        if expect_fatal:
            assert "tp rank 1" in str(caught.value)


def test_with_tensor_parallelism_an_injected_fault_is_unrecoverable_too():
    """The wrapper follows the worker's rule; the forward it fails still ran."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    ran: list[object] = []

    class Inner:
        device_row = None

        def submit(self, fi):
            ran.append(fi)
            done: Future = Future()
            done.set_result("output")
            return done

    fi = SimpleNamespace(rows=[SimpleNamespace(tokens=[POISON])], sampling=[])
    for size, expect_fatal in ((1, False), (2, True)):
        wrapped = FaultInjectingExecutor(Inner(), FaultPlan(forward_token=POISON), size)
        with pytest.raises(Exception, match="injected forward fault") as caught:
            wrapped.submit(fi).result()
        assert is_unrecoverable(caught.value) is expect_fatal
    assert ran == [fi, fi]
    clean = SimpleNamespace(rows=[SimpleNamespace(tokens=[1])], sampling=[])
    assert FaultInjectingExecutor(Inner(), FaultPlan(forward_token=POISON)).submit(clean).result() == "output"


@LOOPS
def test_a_failed_batch_ends_its_requests_and_the_rest_are_served_unchanged(make_harness, loop):
    want = run_alone(make_harness, PREFIX + [30, 31], max_new_tokens=6, ignore_eos=True)
    h = harness(make_harness, loop, page_size=4, max_running_requests=2)
    inject(h, FaultPlan(forward_token=POISON))
    h.submit("poisoned", PREFIX + [POISON, 40], max_new_tokens=6, ignore_eos=True)
    h.submit("neighbour", [21, 22, 23], max_new_tokens=6, ignore_eos=True)  # same batch
    h.submit("waiting", PREFIX + [30, 31], max_new_tokens=6, ignore_eos=True)  # no slot yet
    h.run_until_idle()
    for rid in ("poisoned", "neighbour"):
        reason = h.finished[rid]
        assert reason.kind == "error", reason
        assert "injected forward fault" in reason.message and "InjectedFault" in reason.message
    assert h.finished["waiting"] == FinishReason("length")
    assert h.outputs["waiting"] == want
    # the poisoned prompt's pages were never cached: the same prefix is computed again
    assert h.cached["waiting"] == 0
    assert h.scheduler.counters.failed_batches == 1
    h.assert_all_free()


@LOOPS
def test_a_fault_while_others_decode_fails_the_whole_batch_and_serving_goes_on(
    make_harness, loop
):
    h = harness(make_harness, loop, page_size=4)
    inject(h, FaultPlan(forward_token=POISON))
    h.submit("running", [21, 22, 23], max_new_tokens=40, ignore_eos=True)
    for _ in range(3):
        h.step()
    assert h.outputs["running"]
    h.submit("poisoned", [POISON, 5, 6], max_new_tokens=4)
    for _ in range(4):  # its prefill is mixed with the running decode: both are lost
        h.step()
    assert h.finished["running"].kind == "error"
    assert h.finished["poisoned"].kind == "error"
    want = run_alone(make_harness, [21, 22, 23], max_new_tokens=5, ignore_eos=True)
    h.submit("after", [21, 22, 23], max_new_tokens=5, ignore_eos=True)
    h.run_until_idle()
    assert h.outputs["after"] == want
    h.assert_all_free()


@LOOPS
def test_a_sampler_fault_for_one_row_loses_that_batch_only(make_harness, loop):
    h = harness(make_harness, loop)
    inject(h, FaultPlan(sample_seed=4242))
    h.submit("seeded", [5, 6, 7], max_new_tokens=3, temperature=1.0, seed=4242)
    h.run_until_idle()
    assert h.finished["seeded"].kind == "error"
    assert "injected sampler fault" in h.finished["seeded"].message
    h.submit("other", [5, 6, 7], max_new_tokens=3, temperature=1.0, seed=1)
    h.run_until_idle()
    assert h.finished["other"] == FinishReason("length")
    h.assert_all_free()


@LOOPS
def test_an_unrecoverable_fault_raises_engine_dead_and_every_request_is_answered(
    make_harness, loop
):
    h = harness(make_harness, loop, max_running_requests=2)
    inject(h, FaultPlan(fatal_token=POISON))
    h.submit("running", [21, 22, 23], max_new_tokens=40, ignore_eos=True)
    h.step()
    h.submit("fatal", [POISON, 1, 2], max_new_tokens=4)
    h.submit("queued", [3, 4, 5], max_new_tokens=4)  # waits for a slot
    with pytest.raises(EngineDead, match="unrecoverable engine fault"):
        for _ in range(5):
            h.step()
    h.scheduler.fail_all(FinishReason("error", message="going down"))
    h.collect()
    assert {rid: r.kind for rid, r in h.finished.items()} == {
        "running": "error", "fatal": "error", "queued": "error"
    }  # fmt: skip
    assert h.finished["queued"].message == "going down"
    h.scheduler.executor.close()
    h.scheduler.intake.requests.clear()  # dead: nothing to give back


@LOOPS
def test_a_launch_that_raises_loses_its_batch_in_every_executor(make_harness, loop, monkeypatch):
    """The model itself raising (not the hook, which fails after it): the stream executor
    launches on the scheduler thread, so its submit must surface the error as the others do,
    through the forward's result; an out-of-memory error is survived."""
    h = harness(make_harness, loop)
    model = h.worker.model
    real_forward = model.forward

    def forward(fb):
        if bool((fb.input_ids == POISON).any()):
            raise torch.OutOfMemoryError("injected: out of memory in the forward")
        return real_forward(fb)

    monkeypatch.setattr(model, "forward", forward)
    h.submit("poisoned", [POISON, 5, 6], max_new_tokens=3)
    h.run_until_idle()
    assert h.finished["poisoned"].kind == "error"
    assert "OutOfMemoryError" in h.finished["poisoned"].message
    want = run_alone(make_harness, [5, 6, 7], max_new_tokens=4, ignore_eos=True)
    h.submit("after", [5, 6, 7], max_new_tokens=4, ignore_eos=True)
    h.run_until_idle()
    assert h.outputs["after"] == want
    h.assert_all_free()


def test_an_integrity_failure_after_a_fault_is_fatal(make_harness, monkeypatch):
    h = make_harness()
    inject(h, FaultPlan(forward_token=POISON))
    cache = h.scheduler.cache

    def broken(*args, **kwargs):
        raise AssertionError("KV pages leak: free 1 + cached 0 + in use 0 != total 2")

    h.submit("poisoned", [POISON], max_new_tokens=2)
    monkeypatch.setattr(cache, "check_integrity", broken)
    with pytest.raises(EngineDead, match="integrity check failed after a fault"):
        h.scheduler.step()
    monkeypatch.undo()


def test_token_ids_outside_the_vocabulary_are_refused_not_crashed_on(make_harness):
    h = make_harness()
    vocab = h.worker.model_config.vocab_size
    h.submit("prompt", [5, vocab], max_new_tokens=2)
    # min_tokens bans the stop tokens in the sampler: an id past the logits crashed it
    h.submit("stop", [5, 6], max_new_tokens=4, min_new_tokens=2, stop_token_ids=[vocab + 7])
    h.submit("fine", [5, 6], max_new_tokens=2)
    h.run_until_idle()
    for rid, bad in (("prompt", vocab), ("stop", vocab + 7)):
        assert h.finished[rid].kind == "abort"
        assert f"token id {bad} is outside the model's vocabulary [0, {vocab})" in (
            h.finished[rid].message
        )
    assert h.finished["fine"] == FinishReason("length")
    h.assert_all_free()


def test_a_request_that_cannot_be_added_fails_alone(make_harness, monkeypatch):
    h = make_harness()
    real_add = h.scheduler.prefill.add

    def add(req):
        if req.rid == "broken":
            raise RuntimeError("boom")
        real_add(req)

    monkeypatch.setattr(h.scheduler.prefill, "add", add)
    h.submit("broken", [5, 6], max_new_tokens=2)
    h.submit("fine", [5, 6], max_new_tokens=2)
    h.run_until_idle()
    assert h.finished["broken"].kind == "error" and "boom" in h.finished["broken"].message
    assert h.finished["fine"] == FinishReason("length")
    h.assert_all_free()
