"""Measuring the real engine for `sluice calibrate`: the real `Scheduler` over the real
`ModelWorker`, fed request patterns that produce the batch shapes a server sees (decode
batches of every size and context, prefills of every length, cached prefixes, mixed
decode + prefill chunks), with every tick timed, in the loop it runs in.

A tick gives up to three measurements (`TickPoint`): the forward of a batch (the worker's
own `forward_seconds`: table writes, model, sampling), the host work before its launch
(choosing the batch, building the `ForwardInput`) and the host work on its result
(processing, taking the output and the stats, as `serve_forever` does each iteration).
In the overlap loop a tick launches batch N and processes batch N-1, so its measurements
belong to two batches; they are attributed to the batch they are about.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.engine.executor import Executor, ExecutorWrapper
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq
from sluice.runtime.scheduler.scheduler import Scheduler


@dataclass(frozen=True)
class ProfileRequest:
    prompt_len: int
    max_new_tokens: int
    prefix_group: int | None = None  # requests of one group share a prompt prefix
    prefix_len: int = 0


@dataclass(frozen=True)
class Scenario:
    """Requests injected before given ticks (tick 0: before the first)."""

    name: str
    arrivals: tuple[tuple[int, tuple[ProfileRequest, ...]], ...]


@dataclass(frozen=True)
class TickPoint:
    loop: str
    scenario: str
    kind: str  # "forward" | "host_schedule" | "host_process"
    features: BatchFeatures
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"loop": self.loop, "scenario": self.scenario, "kind": self.kind,
                "seconds": self.seconds, **self.features.to_dict()}  # fmt: skip


def scenarios(max_rows: int, context_len: int, scale: float = 1.0) -> list[Scenario]:
    """The calibration's request patterns, sized to the engine (`max_rows` request slots,
    `context_len` longest sequence) and scaled by `scale` (prompt lengths).

    Long decode contexts come from a shared prefix: one request computes it, the others
    find it in the radix cache and prefill only their own few tokens, so a batch of 64
    requests over 400-token contexts costs one 400-token prefill, not 64."""

    def n(x: float) -> int:
        return max(1, int(round(x * scale)))

    def fits(prompt: int, out: int) -> int:
        return max(1, min(prompt, context_len - out - 1))

    def same(count: int, prompt: int, out: int, group: int | None = None, prefix: int = 0) -> tuple[ProfileRequest, ...]:
        return tuple(ProfileRequest(fits(prompt, out), out, group, prefix) for _ in range(count))

    out: list[Scenario] = []
    batches = sorted({min(b, max_rows) for b in (1, 2, 4, 8, 16, 32, 48, 64)})
    for b in batches:  # decode at every batch size, short contexts
        out.append(Scenario(f"decode-b{b}", ((0, same(b, n(24), 8)),)))
    for b, c in ((8, 1024), (16, 640), (32, 512), (64, 384)):  # decode over long contexts
        b = min(b, max_rows)
        k = min(n(c), context_len // 2)
        out.append(Scenario(f"context-b{b}-c{k}", (
            (0, same(1, k + 8, 2, group=c, prefix=k)),
            (3, same(b, k + 8, 6, group=c, prefix=k)),
        )))  # fmt: skip
    for p in (16, 64, 160, 320, 640, 1024):  # a prefill alone, then its decode
        out.append(Scenario(f"prefill-{p}", ((0, same(1, n(p), 2)),)))
    out.append(Scenario("prefill-8x160", ((0, same(min(8, max_rows), n(160), 2)),)))
    for k, s in ((256, 64), (768, 256)):  # a cached prefix, then its extension
        out.append(Scenario(f"cached-{k}+{s}", (
            (0, same(1, n(k) + 16, 2, group=1000 + k, prefix=n(k))),
            (3, same(1, n(k) + n(s), 2, group=1000 + k, prefix=n(k))),
        )))  # fmt: skip
    for b, p in ((8, 160), (32, 512), (16, 1024)):  # decode rows + a prefill chunk
        b = min(b, max_rows - 1)
        if b >= 1:
            out.append(Scenario(f"mixed-b{b}-p{p}", ((0, same(b, n(24), 10)), (3, same(1, n(p), 4)))))
    return out


def warmup_scenario(max_rows: int) -> Scenario:
    """Shapes the engine sees first pay one-time costs (kernel and GEMM set-up); run before
    anything is recorded."""
    reqs = tuple(ProfileRequest(48, 6) for _ in range(min(8, max_rows)))
    return Scenario("warmup", ((0, reqs), (2, (ProfileRequest(300, 3),))))


class RecordingExecutor(ExecutorWrapper):
    """The scheduler's executor, remembering each submitted batch's features (and, for the
    CPU clock, the thread CPU time the submit took: the whole forward in the normal loop)."""

    def __init__(self, inner: Executor) -> None:
        super().__init__(inner)
        self.submitted: deque[tuple[BatchFeatures, Future[ForwardOutput]]] = deque()
        self.submit_cpu: dict[int, float] = {}

    def submit(self, fi: ForwardInput) -> Future[ForwardOutput]:
        c0 = time.thread_time()
        fut = self.inner.submit(fi)
        self.submit_cpu[id(fut)] = time.thread_time() - c0
        self.submitted.append((BatchFeatures.of(fi), fut))
        return fut


CLOCKS = ("wall", "cpu")


@dataclass
class Profiler:
    """Runs scenarios through `scheduler` and keeps a `TickPoint` per measurement.

    `clock`: `wall` (what a server sees), or `cpu`: this thread's CPU time, which other
    processes on a shared machine barely move (normal loop, one torch thread only: the
    forward then runs on this thread and on no other)."""

    scheduler: Scheduler
    worker: ModelWorker
    overlap: bool
    seed: int = 0
    clock: str = "wall"
    points: list[TickPoint] = field(default_factory=list)
    ticks: int = 0

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"clock must be one of {CLOCKS}")
        if self.clock == "cpu" and self.overlap:
            raise ValueError("the CPU clock measures the normal loop only (the overlap loop's forward runs on another thread)")
        self.recorder = RecordingExecutor(self.scheduler.executor)
        self.scheduler.executor = self.recorder  # type: ignore[assignment]
        self._rng = random.Random(self.seed)
        self._prefixes: dict[int, list[int]] = {}
        self._n = 0
        vocab = self.worker.model_config.vocab_size
        eos = set(self.worker.eos_token_ids)
        self._ids = [i for i in range(min(vocab, 32000)) if i not in eos and i > 3]

    @property
    def loop(self) -> str:
        return "overlap" if self.overlap else "normal"

    def _tokens(self, n: int) -> list[int]:
        return [self._rng.choice(self._ids) for _ in range(n)]

    def _submit(self, r: ProfileRequest) -> None:
        ids: list[int] = []
        if r.prefix_group is not None:
            prefix = self._prefixes.setdefault(r.prefix_group, self._tokens(r.prefix_len))
            ids = prefix[: r.prompt_len]
        ids += self._tokens(r.prompt_len - len(ids))
        params = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=0.0, ignore_eos=True)
        self._n += 1
        self.scheduler.handle(TokenizedGenerateReq(f"cal-{self._n}", ids, params, time.time()))

    def run(self, scenario: Scenario, record: bool = True) -> None:
        self.scheduler.cache.flush()  # no prefix cached from an earlier scenario
        pending = dict(scenario.arrivals)
        tick = 0
        while pending or self.scheduler.has_work:
            for r in pending.pop(tick, ()):
                self._submit(r)
            if not self.scheduler.has_work:
                tick += 1
                continue
            self._tick(scenario.name if record else None)
            tick += 1
        self.scheduler.on_idle()

    def _tick(self, scenario: str | None) -> None:
        s = self.scheduler
        s.timing.take()
        c0 = time.thread_time()
        result = s.step_overlap() if self.overlap else s.step()
        t0 = time.perf_counter()
        s.take_output()
        s.stats()
        s.take_queue_times()
        post = time.perf_counter() - t0
        tick_cpu = time.thread_time() - c0
        timing = s.timing.take()
        self.ticks += 1
        in_flight = s.inflight.launched.result if s.inflight.launched is not None else None
        processed: list[tuple[BatchFeatures, Future[ForwardOutput]]] = []
        launched: tuple[BatchFeatures, Future[ForwardOutput]] | None = None
        while self.recorder.submitted and self.recorder.submitted[0][1] is not in_flight:
            processed.append(self.recorder.submitted.popleft())
        if result is not None:
            launched = processed[-1] if not self.overlap else (
                self.recorder.submitted[0] if self.recorder.submitted else None
            )
        if scenario is None:
            return
        schedule = timing.schedule + timing.launch
        if not self.overlap:
            schedule -= timing.forward  # the normal loop's launch ran the forward
        process = timing.process + post
        forwards = {id(fut): fut.result().forward_seconds for _, fut in processed}
        submit_cpu = {id(f): self.recorder.submit_cpu.pop(id(f), 0.0) for _, f in processed}
        if self.clock == "cpu":  # the forward ran inside submit; the rest of the tick is host work
            forwards = submit_cpu
            host_cpu = max(0.0, tick_cpu - sum(submit_cpu.values()))
            share = schedule / (schedule + process) if schedule + process > 0 else 0.5
            schedule, process = host_cpu * share, host_cpu * (1 - share)
        if launched is not None:
            self.points.append(TickPoint(self.loop, scenario, "host_schedule", launched[0], schedule))
        for features, fut in processed:
            self.points.append(TickPoint(self.loop, scenario, "forward", features, forwards[id(fut)]))
        if processed:
            for features, _ in processed:
                self.points.append(TickPoint(self.loop, scenario, "host_process", features, process / len(processed)))


def iter_kind(points: list[TickPoint], loop: str, kind: str) -> Iterator[TickPoint]:
    return (p for p in points if p.loop == loop and p.kind == kind)
