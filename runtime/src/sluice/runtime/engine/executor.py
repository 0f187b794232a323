"""How the scheduler runs a batch: now (normal loop) or on a forward thread (overlap loop).

The overlap loop launches batch N and processes batch N-1's result while N runs. On the
CPU the forward runs on one background thread (torch releases the GIL inside its kernels),
so jobs execute strictly in launch order: a job reads the tokens the previous job sampled
through the worker's future-token buffer, and writes to KV slots the previous job has
finished with. Each job's inputs are snapshotted at launch (`ModelWorker.prepare`) and
referenced by the job until it completes.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from sluice.runtime.engine.model_worker import ForwardJob, ModelWorker
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow
from sluice.runtime.scheduler.batch import ScheduledBatch


@dataclass(frozen=True)
class ForwardResult:
    output: SampleOutput
    forward_seconds: float


class Executor(Protocol):
    def submit(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> Future[ForwardResult]: ...

    def close(self) -> None: ...


def _timed(worker: ModelWorker, job: ForwardJob) -> ForwardResult:
    start = time.perf_counter()
    out = worker.run(job)
    return ForwardResult(out, time.perf_counter() - start)


class SyncExecutor:
    """Runs the forward on the calling thread; the returned future is already done."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker

    def submit(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> Future[ForwardResult]:
        fut: Future[ForwardResult] = Future()
        fut.set_result(_timed(self.worker, self.worker.prepare(batch, rows)))
        return fut

    def close(self) -> None:
        pass


class ThreadExecutor:
    """Runs forwards on one background thread, in submission order."""

    def __init__(self, worker: ModelWorker) -> None:
        self.worker = worker
        self._jobs: queue.SimpleQueue[tuple[ForwardJob, Future[ForwardResult]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="forward", daemon=True)
        self._thread.start()

    def submit(self, batch: ScheduledBatch, rows: list[SamplingRow]) -> Future[ForwardResult]:
        fut: Future[ForwardResult] = Future()
        self._jobs.put((self.worker.prepare(batch, rows), fut))
        return fut

    def _loop(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, fut = item
            try:
                fut.set_result(_timed(self.worker, job))
            except BaseException as err:  # surfaced on the scheduler thread by .result()
                fut.set_exception(err)

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5)
