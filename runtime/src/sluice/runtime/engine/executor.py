"""How the scheduler runs a forward: now (normal loop), or overlapped with the scheduler's
own work (overlap loop): on a forward thread on the CPU, on a CUDA stream on a GPU.

The overlap loop launches batch N and processes batch N-1's result while N runs. Forwards
run strictly in launch order (one thread, or one stream), so a forward reads the tokens
the previous one sampled from the worker's token table and writes to KV slots the previous
one has finished with. A `ForwardInput` is immutable: the scheduler may change its
requests while the forward runs.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

import torch

from sluice.runtime.engine.blocked_time import BlockedTime
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput
from sluice.runtime.engine.model_worker import LaunchedForward, ModelWorker, SampledForward


class PendingOutput(Protocol):
    def result(self) -> ForwardOutput:
        """The forward's output; waits for it (raises what the forward raised)."""


DeviceRowReader = Callable[[int, int], list[int]]
"""(row, n) -> the first `n` KV slots the device's page table holds for request row `row`."""


class Executor(Protocol):
    device_row: DeviceRowReader | None
    """What the integrity check compares the host's books with; None where there is no
    device table (the simulator)."""

    def submit(self, fi: ForwardInput) -> PendingOutput: ...

    def wait_idle(self) -> None:
        """Return once every submitted forward has finished on the device."""

    def close(self) -> None: ...


class ExecutorWrapper:
    """An executor around another that changes only `submit` (a test's fault injection,
    the calibration's recorder): the rest is the inner one's."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.device_row: DeviceRowReader | None = inner.device_row

    def submit(self, fi: ForwardInput) -> PendingOutput:
        return self.inner.submit(fi)

    def wait_idle(self) -> None:
        self.inner.wait_idle()

    def close(self) -> None:
        self.inner.close()


class SyncExecutor:
    """Runs the forward on the calling thread; the returned future is already done."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self.device_row: DeviceRowReader | None = worker.device_row
        self.blocked = BlockedTime("normal")

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]:
        fut: Future[ForwardOutput] = Future()
        began = time.perf_counter()
        try:
            fut.set_result(self.worker.run(fi))
        except Exception as err:  # surfaced by .result(), as on the thread
            fut.set_exception(err)
        self.blocked.waited(time.perf_counter() - began)  # the forward runs on this thread
        self.blocked.enqueued(0.0)
        return fut

    def wait_idle(self) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadExecutor:
    """Runs forwards on one background thread, in submission order."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self.device_row: DeviceRowReader | None = worker.device_row
        self._jobs: queue.SimpleQueue[tuple[ForwardInput, Future[ForwardOutput]] | None] = (
            queue.SimpleQueue()
        )
        self._last: Future[ForwardOutput] | None = None
        self._thread = threading.Thread(target=self._loop, name="forward", daemon=True)
        self._thread.start()

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]:
        fut: Future[ForwardOutput] = Future()
        self._jobs.put((fi, fut))
        self._last = fut
        return fut

    def wait_idle(self) -> None:
        if self._last is not None:
            self._last.exception()  # waits; an error is surfaced where the result is read

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            fi, fut = item
            try:
                fut.set_result(self.worker.run(fi))
            except BaseException as err:  # surfaced on the scheduler thread by .result()
                fut.set_exception(err)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)


class DeviceStreams(Protocol):
    """Where the stream executor enqueues work, and how it waits for it."""

    def side(self) -> contextlib.AbstractContextManager[Any]: ...

    def record(self) -> Any:
        """An event after everything enqueued on the side stream so far (`.synchronize()`)."""

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of `t`, started on the side stream (valid once the next event is met)."""


class CudaStreams:
    def __init__(self, device: str) -> None:
        self.stream = torch.cuda.Stream(device)

    def side(self) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            host.copy_(t, non_blocking=True)
        return host


class _Done:
    def synchronize(self) -> None:
        pass


class HostStreams:
    """The stream executor's protocol on a device that runs each op when called (the CPU):
    what the tests drive to check the executor's ordering without a GPU."""

    def side(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def record(self) -> Any:
        return _Done()

    def to_host(self, t: torch.Tensor) -> torch.Tensor:
        return t


class _StreamResult:
    """One forward enqueued on the side stream; its sampling follows once the vocab mask
    is known (at once without one), and its host copies once the stream's event is met."""

    def __init__(self, executor: StreamExecutor, launched: LaunchedForward) -> None:
        self.executor = executor
        self.launched = launched
        self.sampled: SampledForward | None = None
        self.event: Any = None
        self.error: BaseException | None = None

    def sample(self, mask: torch.Tensor | None) -> None:
        streams, worker = self.executor.streams, self.executor.worker
        try:
            with streams.side():
                sampled = worker.sample(self.launched, mask)
            self.sampled = _host_copy(sampled, streams)
            self.event = streams.record()
        except BaseException as err:  # surfaced by result(), on the scheduler thread
            self.error = err

    def sample_when_masked(self, mask: Future[torch.Tensor | None]) -> None:
        try:
            value = mask.result()
        except BaseException as err:
            self.error = err
            return
        self.sample(value)

    def result(self) -> ForwardOutput:
        if self.error is not None:
            raise self.error
        if self.sampled is None:
            raise RuntimeError("a forward's result was read before its vocab mask was filled")
        began = time.perf_counter()
        self.event.synchronize()
        self.executor.blocked.waited(time.perf_counter() - began)
        return self.executor.worker.collect(self.sampled)


class _FailedLaunch:
    """A forward whose launch raised: reading its result raises what the launch did."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def result(self) -> ForwardOutput:
        raise self.error


def _host_copy(sampled: SampledForward, streams: DeviceStreams) -> SampledForward:
    out = sampled.out
    if out is not None:
        out = type(out)(
            streams.to_host(out.token_ids),
            streams.to_host(out.logprobs) if out.logprobs is not None else None,
            streams.to_host(out.top_ids) if out.top_ids is not None else None,
            streams.to_host(out.top_logprobs) if out.top_logprobs is not None else None,
        )
    prompt = sampled.prompt_logprobs
    if prompt is not None:
        prompt = [streams.to_host(v) for v in prompt]
    return SampledForward(sampled.launched, out, prompt)


class StreamExecutor:
    """Overlap on a GPU without a forward thread: the scheduler thread enqueues batch N's
    forward on a side stream and goes on to process N-1; the token ids come back by a
    non-blocking copy into pinned memory, and reading N's result waits on N's event. A
    constrained batch's sampling is enqueued when its vocab mask is filled (right after
    the previous result is processed)."""

    def __init__(self, worker: ModelWorker, streams: DeviceStreams | None = None) -> None:
        self.worker = worker
        self.device_row: DeviceRowReader | None = worker.device_row
        self.streams = streams if streams is not None else CudaStreams(worker.device)
        self._last: _StreamResult | None = None
        self.blocked = BlockedTime("overlap")

    def submit(self, fi: ForwardInput) -> _StreamResult | _FailedLaunch:
        began = time.perf_counter()
        try:
            return self._submit(fi)
        finally:
            self.blocked.enqueued(time.perf_counter() - began)

    def _submit(self, fi: ForwardInput) -> _StreamResult | _FailedLaunch:
        try:
            with self.streams.side():
                handle = _StreamResult(self, self.worker.launch(fi))
        except Exception as err:  # surfaced by result(), as the other executors do
            return _FailedLaunch(err)
        if fi.vocab_mask is None:
            handle.sample(None)
        else:
            fi.vocab_mask.result.add_done_callback(handle.sample_when_masked)
        self._last = handle
        return handle

    def wait_idle(self) -> None:
        if self._last is not None and self._last.event is not None:
            self._last.event.synchronize()

    def close(self) -> None:
        self.wait_idle()


def overlap_executor(worker: ModelWorker) -> Executor:
    """The overlap loop's executor for the worker's device."""
    if str(worker.device).startswith("cuda"):
        return StreamExecutor(worker)
    return ThreadExecutor(worker)
