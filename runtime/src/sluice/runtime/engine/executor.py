"""How the scheduler runs a forward: now (normal loop) or on a forward thread (overlap).

The overlap loop launches batch N and processes batch N-1's result while N runs. Jobs run
strictly in launch order on one background thread (torch releases the GIL inside its
kernels), so a job reads the tokens the previous job sampled from the worker's token table
and writes to KV slots the previous job has finished with. A `ForwardInput` is immutable:
the scheduler may change its requests while the job runs.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Protocol

from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput
from sluice.runtime.engine.model_worker import ModelWorker


class Executor(Protocol):
    worker: ModelWorker

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]: ...

    def wait_idle(self) -> None:
        """Return once every submitted forward has finished on the device."""

    def close(self) -> None: ...


class SyncExecutor:
    """Runs the forward on the calling thread; the returned future is already done."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]:
        fut: Future[ForwardOutput] = Future()
        try:
            fut.set_result(self.worker.run(fi))
        except Exception as err:  # surfaced by .result(), as on the thread
            fut.set_exception(err)
        return fut

    def wait_idle(self) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadExecutor:
    """Runs forwards on one background thread, in submission order."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
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
