"""The model replaced by a cost: `SimExecutor` is the `Executor` the real `Scheduler` calls,
answering every forward at once and moving a virtual clock by what the forward would
have cost on the calibrated machine.

Where time goes, in the order the scheduler's loops spend it:

- host work before the launch (choosing the batch, building the `ForwardInput`): added to
  the clock when the batch is submitted;
- the forward itself: it starts when it is submitted and the previous forward has
  finished (one forward thread), and the clock reaches its end when the scheduler reads
  its result (`SimFuture.result`);
- host work on the result (processing, emitting): added at the next clock event after
  the result was read (the next submit or result, or the end of the tick), so that in the
  overlap loop it overlaps the forward launched before it, as on the real machine.

In the normal loop this gives tick = schedule + forward + process; in the overlap loop
the forward of batch N runs while batch N-1 is processed and batch N+1 scheduled.

In a server the other processes share the cores: the forward also pays the calibration's
`ServingCost.tick_extra` (streaming the tick's tokens, sending its outputs, the slower
forward among the other processes), measured through a real server.

Sampled tokens are one fixed id that is neither EOS nor a stop token, so an output is as
long as its `max_new_tokens` (what `bench_serving` asks with `ignore_eos`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.engine.executor import DeviceRowReader
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput
from sluice.runtime.scheduler.schedule_trace import ScheduleTrace
from sluice.runtime.sim.cost_model import LoopCost, ServingCost


@dataclass
class VirtualClock:
    now: float = 0.0

    def advance(self, seconds: float) -> None:
        self.now += max(0.0, seconds)

    def advance_to(self, t: float) -> None:
        self.now = max(self.now, t)


def filler_token(eos_token_ids: Iterable[int], vocab_size: int) -> int:
    """The token every simulated forward samples: the largest id that is not EOS."""
    eos = set(eos_token_ids)
    for token in range(vocab_size - 1, -1, -1):
        if token not in eos:
            return token
    raise ValueError("every token id is an EOS id")


class SimFuture(Future[ForwardOutput]):
    """A forward's result, available at once to the code but only at `end` on the clock:
    reading it moves the clock there (the scheduler waited for the forward)."""

    def __init__(self, end: float, on_read: Callable[[SimFuture], None]) -> None:
        super().__init__()
        self.end = end
        self._on_read = on_read
        self._read = False

    def result(self, timeout: float | None = None) -> ForwardOutput:
        if not self._read:
            self._read = True
            self._on_read(self)
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self._read:
            self._read = True
            self._on_read(self)
        return super().exception(timeout)


@dataclass
class LaunchRecord:
    """One simulated forward, for tests and the schedule trace."""

    features: BatchFeatures
    submitted: float
    start: float
    end: float
    rows: list[tuple[int, int, int, bool]] = field(default_factory=list)  # row, start, length, sample


class SimExecutor:
    def __init__(
        self,
        clock: VirtualClock,
        cost: LoopCost,
        token_id: int,
        record: bool = False,
        trace: ScheduleTrace | None = None,
        serving: ServingCost | None = None,
    ) -> None:
        self.clock = clock
        self.cost = cost
        self.token_id = token_id
        self.device_row: DeviceRowReader | None = None  # no device tables to compare
        self.device_free_at = 0.0
        self.pending_host = 0.0  # processing cost of a result read, not yet on the clock
        self.launches: list[LaunchRecord] = []
        self.record = record
        self.trace = trace
        self.serving = serving or ServingCost()
        self.busy_seconds = 0.0  # forward time so far (the CPU-utilisation signal)
        self.forwards = 0

    def flush_host(self) -> None:
        self.clock.advance(self.pending_host)
        self.pending_host = 0.0

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]:
        self.flush_host()
        features = BatchFeatures.of(fi)
        submitted = self.clock.now
        self.clock.advance(self.cost.host_schedule.predict(features))
        start = max(self.clock.now, self.device_free_at)
        seconds = self.cost.forward.predict(features)
        seconds += self.serving.tick_extra(features, seconds)
        end = start + seconds
        self.device_free_at = end
        self.busy_seconds += seconds
        self.forwards += 1
        process = self.cost.host_process.predict(features)

        def on_read(fut: SimFuture) -> None:
            self.flush_host()
            self.clock.advance_to(fut.end)
            self.pending_host += process
            if self.trace is not None:  # as the server's TracingExecutor: when it is read
                self.trace.forward(fi, submitted, self.clock.now, seconds, features)

        fut = SimFuture(end, on_read)
        n = len(fi.sampling)
        fut.set_result(ForwardOutput([self.token_id] * n, [None] * n, seconds))
        if self.record:
            rows = [(r.row, r.start, r.length, r.sample) for r in fi.rows]
            self.launches.append(LaunchRecord(features, submitted, start, end, rows))
        return fut

    def wait_idle(self) -> None:
        pass

    def close(self) -> None:
        pass
