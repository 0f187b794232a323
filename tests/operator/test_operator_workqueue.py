"""The controller's work queue: de-duplication, one worker per key, delays, back-off.
Time is driven by the event loop's clock; the delays are short and only lower bounds are
asserted."""

from __future__ import annotations

import asyncio

import pytest

from sluice.operator.workqueue import Backoff, WorkQueue


def run(coro):
    return asyncio.run(coro)


def test_backoff_doubles_up_to_its_cap():
    backoff = Backoff(base=0.5, cap=4)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1, 2, 4, 4, 4]


def test_a_key_added_many_times_is_queued_once():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(Backoff(1, 1))
        for _ in range(3):
            queue.add("a")
        queue.add("b")
        assert len(queue) == 2
        assert [await queue.get(), await queue.get()] == ["a", "b"]

    run(scenario())


def test_a_key_added_while_worked_on_comes_back_once_done():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(Backoff(1, 1))
        queue.add("a")
        key = await queue.get()
        queue.add("a")
        queue.add("a")
        assert len(queue) == 0  # not handed to a second worker meanwhile
        queue.done(key)
        assert len(queue) == 1 and await queue.get() == "a"

    run(scenario())


def test_add_after_waits_and_an_earlier_add_wins():
    async def scenario():
        loop = asyncio.get_running_loop()
        queue: WorkQueue[str] = WorkQueue(Backoff(1, 1))
        start = loop.time()
        queue.add_after("a", 0.2)
        queue.add_after("a", 5)  # later than the pending one: ignored
        assert await asyncio.wait_for(queue.get(), 2) == "a"
        assert loop.time() - start >= 0.2

    run(scenario())


def test_failures_back_off_and_forget_resets():
    async def scenario():
        queue: WorkQueue[str] = WorkQueue(Backoff(0.05, 10))
        assert queue.add_rate_limited("a") == 0.05
        assert queue.add_rate_limited("a") == 0.1
        queue.forget("a")
        assert queue.add_rate_limited("a") == 0.05
        queue.discard("a")
        assert queue.failures("a") == 0
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(queue.get(), 0.2)  # discarded: the retry never fires

    run(scenario())


def test_a_namespace_being_deleted_is_final_not_retried(monkeypatch):
    """The API server's NamespaceLifecycle answer (403) in a namespace being deleted: the
    key is dropped, not retried with back-off until the namespace is gone."""
    import asyncio

    from sluice.operator import controller as controller_module
    from sluice.operator.controller import Controller
    from sluice.operator.kube import ApiError
    from sluice.operator.settings import Settings

    async def refused(key, ctx, seen=None, *, fresh=True):
        raise ApiError(
            403, "Forbidden",
            'deployments.apps "chat" is forbidden: unable to create new content in namespace'
            " ml because it is being terminated",
        )  # fmt: skip

    class Ctx:
        settings = Settings()

    monkeypatch.setattr(controller_module, "reconcile", refused)

    async def scenario() -> tuple[int, int]:
        ctl = Controller(Ctx())  # type: ignore[arg-type]
        ctl.queue.add(("ml", "chat"))
        key = await ctl.queue.get()
        await ctl._run(key)
        ctl.queue.done(key)
        return ctl.queue.failures(key), len(ctl.queue)

    assert asyncio.run(scenario()) == (0, 0)
