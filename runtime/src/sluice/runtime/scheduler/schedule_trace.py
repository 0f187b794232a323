"""The schedule trace: what the scheduler received and launched, one JSON line per event,
written by the real server (`sluice serve --schedule-trace FILE`) and by the simulator
(`sluice simulate --schedule-trace FILE`) in the same layout, so the two can be compared
tick by tick on the same arrivals (`sim.trace_compare`).

    {"event": "arrival", "t": T, "handed": T, "rid": R, "prompt_tokens": N}
    {"event": "forward", "submitted": T, "end": T, "seconds": S, "rows": [[row, start,
     length, sample, decode], ...], "decode_rows": ..., "prefill_tokens": ..., ...}

Times are seconds on one clock: `time.monotonic()` in a server (the clock the benchmark
client's `perf_counter` reads on Linux), the virtual clock in the simulator. `seconds` is
the forward's own time (`ForwardOutput.forward_seconds`; the cost model's in the
simulator); `end` is when its result was ready.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from sluice.runtime.engine.batch_features import BatchFeatures, is_decode_row
from sluice.runtime.engine.executor import Executor, ExecutorWrapper, PendingOutput
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput


class ScheduleTrace:
    """Appends events to a JSON-lines file (line-buffered: a killed server keeps what it
    wrote)."""

    def __init__(self, path: str | Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = self.path.open("w", buffering=1)
        self.clock = clock

    def _write(self, record: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(record) + "\n")

    def arrival(self, rid: str, prompt_tokens: int, handed: float) -> None:
        """The scheduler took `rid` in now; the API server had handed it over at `handed`
        (on this trace's clock): the loop reads its inbox between ticks, so `t` is a tick
        boundary and `handed` when the request was really there."""
        self._write({"event": "arrival", "t": self.clock(), "handed": handed,
                     "rid": rid, "prompt_tokens": prompt_tokens})  # fmt: skip

    def forward(
        self,
        fi: ForwardInput,
        submitted: float,
        end: float,
        seconds: float,
        features: BatchFeatures | None = None,
    ) -> None:
        """`features`: `BatchFeatures.of(fi)` where the caller has it already."""
        rows = [[r.row, r.start, r.length, r.sample, is_decode_row(r)] for r in fi.rows]
        features = features or BatchFeatures.of(fi)
        self._write({"event": "forward", "submitted": submitted, "end": end, "seconds": seconds,
                     "rows": rows, **features.to_dict()})  # fmt: skip

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class _TracedOutput:
    def __init__(self, inner: PendingOutput, on_result: Callable[[ForwardOutput], None]) -> None:
        self._inner = inner
        self._on_result = on_result
        self._seen = False

    def result(self) -> ForwardOutput:
        out = self._inner.result()
        if not self._seen:
            self._seen = True
            self._on_result(out)
        return out


class TracingExecutor(ExecutorWrapper):
    """Records each forward when the scheduler reads its result (the overlap loop reads it
    a tick later: `end` is then when it was read, `seconds` still the forward's own)."""

    def __init__(self, inner: Executor, trace: ScheduleTrace) -> None:
        super().__init__(inner)
        self.trace = trace

    def submit(self, fi: ForwardInput) -> PendingOutput:
        submitted = self.trace.clock()
        pending = self.inner.submit(fi)

        def record(out: ForwardOutput) -> None:
            self.trace.forward(fi, submitted, self.trace.clock(), out.forward_seconds)

        return _TracedOutput(pending, record)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.trace.close()


def wall_to_monotonic(wall: float) -> float:
    """A `time.time()` stamp (what the API server puts on a request it hands over) on the
    `time.monotonic()` clock of this machine."""
    return wall - (time.time() - time.monotonic())


def read_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    with Path(path).open() as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)
