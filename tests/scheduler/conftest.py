"""Drive the real scheduler tick by tick on a tiny random model (no processes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from concurrent.futures import wait
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import AbortReq, SamplingParams, TokenizedGenerateReq
from sluice.runtime.scheduler.process import build_scheduler
from sluice.runtime.scheduler.scheduler import Scheduler, TickResult
from sluice.runtime.server_args import ServerArgs


@dataclass
class Harness:
    scheduler: Scheduler
    worker: ModelWorker
    outputs: dict[str, list[int]] = field(default_factory=dict)
    finished: dict[str, object] = field(default_factory=dict)
    cached: dict[str, int] = field(default_factory=dict)  # prompt tokens served from the cache
    ticks: list[TickResult] = field(default_factory=list)

    def submit(self, rid: str, input_ids: list[int], **sampling: object) -> None:
        params = SamplingParams(**{"temperature": 0.0, **sampling})
        self.scheduler.handle(TokenizedGenerateReq(rid, list(input_ids), params))
        if self.scheduler.grammars:
            # a grammar compiles on a thread: waiting here makes the tick that admits the
            # request the same on every run (not whichever tick the compiler finishes by)
            wait([future for _, future in self.scheduler.grammars.pending.values()])

    def abort(self, rid: str) -> None:
        self.scheduler.handle(AbortReq(rid))
        self.collect()

    @property
    def overlap(self) -> bool:
        return self.worker.args.overlap_schedule

    def step(self) -> TickResult | None:
        tick = self.scheduler.step_overlap() if self.overlap else self.scheduler.step()
        if tick is not None:
            self.ticks.append(tick)
        self.collect()
        self.scheduler.check_integrity()
        return tick

    def collect(self) -> None:
        out = self.scheduler.take_output()
        if out is None:
            return
        for u in out.updates:
            self.outputs.setdefault(u.rid, []).extend(u.new_token_ids)
            self.cached[u.rid] = u.cached_tokens
            if u.finished is not None:
                self.finished[u.rid] = u.finished

    def run_until_idle(self, max_ticks: int = 10_000) -> None:
        for _ in range(max_ticks):
            if self.step() is None and not self.scheduler.has_work:
                return
        raise AssertionError("scheduler did not go idle")

    def assert_all_free(self) -> None:
        """No request holds anything; every page is free or (evictably) cached."""
        cache = self.scheduler.cache
        assert not self.scheduler.live_requests()
        assert cache.rows.available_size == cache.rows.size
        assert cache.available_size == cache.total_tokens
        self.scheduler.check_integrity()


HarnessFactory = Callable[..., Harness]


@pytest.fixture
def make_harness(tiny_llama_path: Path) -> Iterator[HarnessFactory]:
    made: list[Harness] = []

    def factory(model_path: Path | None = None, **overrides: object) -> Harness:
        path = model_path or tiny_llama_path
        defaults = {
            "device": "cpu",
            "dtype": "float32",  # the HF-exact path: several tests compare with transformers
            "max_total_tokens": 4096,
            "max_running_requests": 8,
            # tests opt in to the overlap loop with disable_overlap_schedule=False (enabled
            # here: on the CPU the server's default is the normal loop)
            "disable_overlap_schedule": True,
            "enable_overlap_schedule": True,
        }
        args = dataclasses.replace(ServerArgs(model=str(path)), **{**defaults, **overrides})
        worker = ModelWorker(args, path)
        harness = Harness(build_scheduler(args, worker), worker)
        made.append(harness)
        return harness

    yield factory
    for h in made:  # after every test: nothing leaked
        h.scheduler.executor.close()
        if not h.scheduler.has_work:
            h.assert_all_free()
