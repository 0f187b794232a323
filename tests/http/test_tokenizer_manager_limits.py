"""The TokenizerManager leaves no client without an answer: the admission limit refuses up
front, `--request-timeout` ends a request (and aborts it in the scheduler), and the engine
going down ends every request in flight with an error. Driven through its real sockets,
with this test as the scheduler and the detokenizer."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from sluice.runtime.entrypoints.request_limits import (
    EngineDown,
    Overloaded,
    RequestLimits,
    TooManyChoices,
)
from sluice.runtime.entrypoints.tokenizer_manager import TokenizerManager
from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    SamplingParams,
    SchedulerReady,
    TextUpdate,
    TokenizedGenerateReq,
)
from sluice.runtime.ipc.sockets import PortArgs, pull_socket, push_socket, recv, send
from sluice.runtime.server_args import ServerArgs

READY = SchedulerReady(1024, 4, 512, 1, 100, [2], "cpu", "float32", "torch")
PARAMS = SamplingParams(max_new_tokens=4)


class Pipeline:
    """A TokenizerManager with this test on the other end of its sockets."""

    def __init__(self, limits: RequestLimits) -> None:
        ports = PortArgs.fresh()
        self.ctx = zmq.Context()
        self.scheduler = pull_socket(self.ctx, ports.scheduler_input)
        self.tm = TokenizerManager(None, "m", READY, ports, limits)
        self.to_tm = push_socket(self.ctx, ports.tokenizer_input)
        self.rejected: list[int] = []
        self.tm.listeners.append(self)

    # listener hooks
    def on_reject(self, n: int) -> None:
        self.rejected.append(n)

    def on_chunk(self, rid, chunk, state) -> None:
        pass

    def on_stats(self, stats) -> None:
        pass

    async def sent(self) -> object:
        return await asyncio.to_thread(recv, self.scheduler, 5000)

    def close(self) -> None:
        self.tm.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def pipeline(request):
    p = Pipeline(request.param if hasattr(request, "param") else RequestLimits())
    yield p
    p.close()


def started(tm: TokenizerManager, **kwargs) -> tuple[object, asyncio.Future]:
    gen = tm.generate([5, 6], PARAMS, **kwargs)
    return gen, asyncio.ensure_future(gen.__anext__())


def test_limits_come_from_the_flags():
    args = ServerArgs(max_running_requests=3, max_queued_requests=5, request_timeout=7.5)
    assert RequestLimits.from_args(args) == RequestLimits(capacity=8, request_timeout_s=7.5)
    unbounded = ServerArgs(max_queued_requests=-1)
    assert RequestLimits.from_args(unbounded).capacity == 0


@pytest.mark.parametrize("pipeline", [RequestLimits(capacity=2)], indirect=True)
def test_past_running_plus_queued_a_request_is_refused_before_it_is_sent(pipeline):
    tm = pipeline.tm

    async def main():
        tm.start()
        first, a = started(tm)
        second, b = started(tm)
        await asyncio.sleep(0)
        with pytest.raises(Overloaded, match="at most 2"):
            await tm.generate([5, 6], PARAMS).__anext__()
        with pytest.raises(Overloaded):
            tm.check_admission(1)
        with pytest.raises(TooManyChoices, match="3 choices"):  # never fits: a 400
            tm.check_admission(3)
        # the server's own prefill-only requests do not count
        own, c = started(tm, admit=False)
        await asyncio.sleep(0)
        sent = [await pipeline.sent() for _ in range(3)]
        assert all(isinstance(m, TokenizedGenerateReq) for m in sent)
        for m in sent:  # all finish: room again
            update = TextUpdate(m.rid, "x", [7], [], FinishReason("length"), 2, 1, 0)
            send(pipeline.to_tm, BatchStrOut([update]))
        for fut in (a, b, c):
            assert (await fut).finished.kind == "length"
        for gen in (first, second, own):
            await gen.aclose()
        tm.check_admission(2)

    asyncio.run(main())
    assert pipeline.rejected == [1, 1]


@pytest.mark.parametrize("pipeline", [RequestLimits(request_timeout_s=0.2)], indirect=True)
def test_past_the_request_timeout_the_client_gets_a_timeout_and_the_scheduler_an_abort(pipeline):
    tm = pipeline.tm

    async def main():
        tm.start()
        gen, first = started(tm)
        sent = await pipeline.sent()
        chunk = await asyncio.wait_for(first, 10)  # nothing from the scheduler: the timeout
        assert chunk.finished.kind == "timeout"
        assert "--request-timeout (0.2 s)" in chunk.finished.message
        abort = await pipeline.sent()
        assert abort == AbortReq(sent.rid)
        # a late update for it is dropped, and nothing else goes to the scheduler
        send(pipeline.to_tm, BatchStrOut([TextUpdate(sent.rid, "x", [7], [], None, 2, 1, 0)]))
        with pytest.raises(StopAsyncIteration):
            await gen.__anext__()
        assert tm.num_inflight == 0

    asyncio.run(main())


def test_when_the_engine_goes_down_every_request_is_answered_and_new_ones_refused(pipeline):
    tm = pipeline.tm

    async def main():
        tm.start()
        pending = [started(tm) for _ in range(3)]
        for _ in pending:
            await pipeline.sent()
        tm.engine_down("the scheduler process exited with code -9")
        for gen, fut in pending:
            chunk = await asyncio.wait_for(fut, 5)
            assert chunk.finished.kind == "error"
            assert chunk.finished.message == "the scheduler process exited with code -9"
            await gen.aclose()
        with pytest.raises(EngineDown, match="exited with code -9"):
            await tm.generate([5], PARAMS).__anext__()
        assert not tm.is_ready and tm.num_inflight == 0

    asyncio.run(main())


def test_the_heartbeat_is_any_message_from_the_pipeline(pipeline):
    tm = pipeline.tm

    async def main():
        tm.start()
        gen, fut = started(tm)
        sent = await pipeline.sent()
        tm.heard_at -= 100  # silent for 100 s
        assert tm.scheduler_stalled(50)
        send(pipeline.to_tm, BatchStrOut([TextUpdate(sent.rid, "x", [7], [], None, 2, 1, 0)]))
        await asyncio.wait_for(fut, 5)
        assert not tm.scheduler_stalled(50)
        await gen.aclose()

    asyncio.run(main())
