"""One simulated replica: the real `Scheduler`, built from `ServerArgs` as `sluice serve`
builds it, over a `SimExecutor` and a virtual clock, driven like `serve_forever` drives
it: take in what has arrived, run one tick, emit what it produced.

Nothing here decides anything the scheduler decides: admission, chunking, mixed batches,
retraction, the radix cache, the policies and both loops are the scheduler's own code.
The replica only says when requests arrive and reads back when tokens came out.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from sluice.runtime.disagg import KVTransfer
from sluice.runtime.engine.worker_setup import (
    PoolLayout,
    SlidingLayers,
    layout_of,
    size_kv_pool,
    split_pools,
)
from sluice.runtime.ipc.messages import (
    DisaggHandoff,
    SamplingParams,
    SchedulerStats,
    TokenizedGenerateReq,
)
from sluice.runtime.scheduler.process import kv_cache, scheduler_config
from sluice.runtime.scheduler.schedule_trace import ScheduleTrace
from sluice.runtime.scheduler.scheduler import Scheduler
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import Calibration
from sluice.runtime.sim.executor import SimExecutor, VirtualClock, filler_token

# Guard against a scheduler that has work it never runs (would loop forever otherwise)
MAX_IDLE_STEPS = 1000


def pool_layout(args: ServerArgs, calibration: Calibration) -> PoolLayout:
    """The pool `ModelWorker` would size for `args` on the calibrated model (the same rule:
    the flag, else the CPU budget; on a GPU the calibration's measured pool), split as it
    splits it when the model has sliding-window layers."""
    facts = calibration.model
    per_token = facts.bytes_per_token
    sliding = None
    if facts.window and not args.disable_hybrid_swa_memory:
        full_bytes = per_token - facts.window_bytes_per_token
        sliding = SlidingLayers(facts.window, (), full_bytes, facts.window_bytes_per_token)
    window_tokens = 0
    if args.max_total_tokens > 0 or facts.device == "cpu":
        total = size_kv_pool(args, "cpu", per_token)
        if sliding is not None:
            total, window_tokens = split_pools(args, total, sliding, facts.model_context_len)
    else:
        total = calibration.kv_pool_tokens
        window_tokens = calibration.kv_window_tokens if sliding is not None else 0
    return layout_of(args, total, window_tokens, sliding, facts.model_context_len)


@dataclass(frozen=True)
class SimRequest:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    arrival: float  # virtual seconds
    ignore_eos: bool = True
    handoff: DisaggHandoff | None = None  # a P/D pair's request (`sim/pd.py`)


@dataclass
class RequestTrace:
    """What the client of one request saw, in virtual seconds."""

    rid: str
    arrival: float
    prompt_len: int
    max_new_tokens: int
    emissions: list[float] = field(default_factory=list)  # one per update carrying tokens
    output_tokens: int = 0
    cached_tokens: int = 0
    finished_at: float | None = None
    finish_reason: str = ""

    @property
    def ttft(self) -> float | None:
        return self.emissions[0] - self.arrival if self.emissions else None

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.emissions, self.emissions[1:], strict=False)]

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival


@dataclass
class BusyWindow:
    """The replica's busy intervals (forwards and host work), for CPU utilisation."""

    intervals: deque[tuple[float, float]] = field(default_factory=deque)
    keep_s: float = 600.0

    def add(self, start: float, end: float) -> None:
        if end > start:
            self.intervals.append((start, end))
        while self.intervals and self.intervals[0][1] < end - self.keep_s:
            self.intervals.popleft()

    def utilisation(self, t0: float, t1: float) -> float:
        """Share of [t0, t1) the replica was busy."""
        if t1 <= t0:
            return 0.0
        busy = 0.0
        last_end = t0
        for s, e in self.intervals:
            s, e = max(s, last_end), min(e, t1)
            if e > s:
                busy += e - s
                last_end = e
        return min(1.0, busy / (t1 - t0))


class SimReplica:
    def __init__(
        self,
        args: ServerArgs,
        calibration: Calibration,
        name: str = "replica",
        start_time: float = 0.0,
        record_launches: bool = False,
        trace_path: str = "",
        transfer: KVTransfer | None = None,
    ) -> None:
        """`transfer`: a P/D replica's (`args.disaggregation_mode` prefill or decode)."""
        self.args = args
        self.name = name
        self.clock = VirtualClock(start_time)
        self.overlap = args.overlap_schedule
        self.pool = pool_layout(args, calibration)
        facts = calibration.model
        token = filler_token(facts.eos_token_ids, facts.vocab_size)
        self.trace = ScheduleTrace(trace_path, clock=lambda: self.clock.now) if trace_path else None
        self.serving = calibration.serving
        self.executor = SimExecutor(
            self.clock, calibration.costs.loop(self.overlap), token, record=record_launches,
            trace=self.trace, serving=self.serving,
        )  # fmt: skip
        config = dataclasses.replace(
            scheduler_config(args, self.pool.context_len), check_integrity_when_idle=False
        )
        self.scheduler = Scheduler(
            config, kv_cache(args, self.pool), self.executor, facts.eos_token_ids,
            disagg_mode=args.disaggregation_mode, transfer=transfer,
        )  # fmt: skip
        self._inbox: list[tuple[float, int, SimRequest]] = []  # heap by hand-over time
        self._events: list[tuple[float, int, object]] = []  # messages due, by time (`post`)
        self._front_free = start_time  # when the API server can hand the next request over
        self._seq = 0
        self.traces: dict[str, RequestTrace] = {}
        self.busy = BusyWindow()
        self.ticks = 0  # loop iterations that ran or finished a batch
        self.steps = 0  # calls of the scheduler's step (its loop iterations with work)
        self.delivered_at_step: dict[str, int] = {}  # rid -> steps before it was handed over
        self.finished: list[RequestTrace] = []  # since the last take_finished()
        self._open = 0  # submitted, not finished
        self._stalled = 0

    # ---- intake -------------------------------------------------------------------------
    def submit(self, req: SimRequest) -> None:
        """`req` is sent at `req.arrival`; the scheduler gets it once the API server has
        handed over the requests sent before it and this one (submit in sending order)."""
        handed = max(req.arrival, self._front_free) + self.serving.hand_over(len(req.input_ids))
        self._front_free = handed
        heapq.heappush(self._inbox, (handed, self._seq, req))
        self._seq += 1
        self.traces[req.rid] = RequestTrace(req.rid, req.arrival, len(req.input_ids), req.max_new_tokens)
        self._open += 1

    def post(self, at: float, msg: object) -> None:
        """Hand `msg` (a transfer's event) to the scheduler at virtual time `at`."""
        heapq.heappush(self._events, (at, self._seq, msg))
        self._seq += 1

    def _deliver_arrived(self) -> None:
        while self._events and self._events[0][0] <= self.clock.now:
            self.scheduler.handle(heapq.heappop(self._events)[2])
        while self._inbox and self._inbox[0][0] <= self.clock.now:
            handed, _, req = heapq.heappop(self._inbox)
            params = SamplingParams(
                max_new_tokens=req.max_new_tokens, temperature=0.0, ignore_eos=req.ignore_eos
            )
            # the scheduler reads arrival_time with `or time.time()`: keep it positive
            msg = TokenizedGenerateReq(
                req.rid, list(req.input_ids), params, req.arrival + 1e-9, req.handoff
            )
            if self.trace is not None:
                self.trace.arrival(req.rid, len(req.input_ids), handed)
            self.scheduler.handle(msg)
            self.delivered_at_step[req.rid] = self.steps

    @property
    def idle(self) -> bool:
        return not self.scheduler.has_work and not self._inbox and not self._events

    @property
    def next_arrival(self) -> float | None:
        """When the next request or event is due (None: nothing is)."""
        due = [q[0][0] for q in (self._inbox, self._events) if q]
        return min(due) if due else None

    # ---- running ------------------------------------------------------------------------
    def step(self) -> bool:
        """One loop iteration at the current virtual time; False when there was nothing
        to do (the clock then waits for the next arrival)."""
        self._deliver_arrived()
        self._collect()  # what the messages produced goes out before the tick (as serve_forever)
        if not self.scheduler.has_work:
            self.scheduler.on_idle()
            return False
        t0 = self.clock.now
        self.steps += 1
        tick = self.scheduler.step_overlap() if self.overlap else self.scheduler.step()
        self.executor.flush_host()
        self.busy.add(t0, self.clock.now)
        self._collect()
        if tick is None and self.clock.now == t0:
            return False
        self.ticks += 1
        return True

    def advance(self, limit: float = math.inf) -> None:
        """One loop iteration if there is work, else wait (move the clock) for the next
        arrival, but not past `limit`."""
        if self.step():
            self._stalled = 0
            return
        nxt = self.next_arrival
        target = min(limit, nxt if nxt is not None else math.inf)
        if target > self.clock.now and target < math.inf:
            self.clock.now = target
            return
        if self.scheduler.has_work:
            self._stalled += 1
            if self._stalled > MAX_IDLE_STEPS:
                raise RuntimeError(
                    f"{self.name}: the scheduler has work it does not schedule "
                    f"(waiting {len(self.scheduler.prefill.waiting)}, "
                    f"running {len(self.scheduler.decode.running)})"
                )

    def run_until(self, t: float) -> None:
        """Run every loop iteration that starts before `t`; the clock ends at or after `t`
        (a tick that began before `t` ends when it ends)."""
        while self.clock.now < t:
            self.advance(t)

    def run_to_completion(self) -> None:
        while not self.idle:
            self.advance()

    def _collect(self) -> None:
        out = self.scheduler.take_output()
        if out is None:
            return
        now = self.clock.now + self.serving.return_s  # when the client reads it
        for u in out.updates:
            trace = self.traces.get(u.rid)
            if trace is None:
                continue
            if u.new_token_ids:
                trace.emissions.append(now)
                trace.output_tokens += len(u.new_token_ids)
            trace.cached_tokens = u.cached_tokens
            if u.finished is not None and trace.finished_at is None:
                trace.finished_at = now
                trace.finish_reason = u.finished.kind
                self._open -= 1
                self.finished.append(trace)

    def take_finished(self) -> list[RequestTrace]:
        done, self.finished = self.finished, []
        return done

    # ---- what the operator's metrics read -----------------------------------------------
    def stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def in_flight(self) -> int:
        """Requests submitted and not finished (what a router counts)."""
        return self._open

    def check_integrity(self) -> None:
        """free + cached + in-use = total, rows not shared (no device tables here)."""
        self.scheduler.cache.check_integrity(self.scheduler.live_requests())


def submit_all(replica: SimReplica, requests: Iterable[SimRequest]) -> None:
    for r in requests:
        replica.submit(r)
