"""Simulator fixtures: the real scheduler over the real tiny model, recording what it
launches (helpers in sim_testkit.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sim_testkit import RecordingScheduler, server_args

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.scheduler.process import build_scheduler
from sluice.runtime.scheduler.scheduler import Scheduler


@pytest.fixture
def real_scheduler(tiny_llama_path: Path) -> Iterator[Callable[..., tuple[RecordingScheduler, ModelWorker]]]:
    made: list[Scheduler] = []

    def factory(**overrides: object) -> tuple[RecordingScheduler, ModelWorker]:
        args = server_args(tiny_llama_path, **overrides)
        worker = ModelWorker(args, tiny_llama_path)
        scheduler = build_scheduler(args, worker)
        made.append(scheduler)
        return RecordingScheduler(scheduler, args.overlap_schedule), worker

    yield factory
    for s in made:
        s.executor.close()
