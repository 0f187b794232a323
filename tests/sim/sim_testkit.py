"""Simulator test helpers: a calibration with known (synthetic) costs for a real worker's
model, and the real scheduler over the real tiny model, recording what it launches. (Not in
conftest.py: another directory's conftest may own that module name in a whole-suite run.)"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from sluice.runtime.engine.forward_input import ForwardInput
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.memory.kv_buffers import bytes_per_token
from sluice.runtime.scheduler.scheduler import Scheduler
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import Calibration, ModelFacts, Startup, window_facts
from sluice.runtime.sim.cost_model import LinearCost, LoopCost, StepCostModel
from sluice.runtime.sim.server_flags import cost_flag_values

# the loop is chosen by disable_overlap_schedule alone (the CPU's default would be the normal loop)
TINY_DEFAULTS = {"device": "cpu", "dtype": "float32", "max_total_tokens": 4096,
                 "max_running_requests": 8, "enable_overlap_schedule": True}  # fmt: skip


def server_args(model: Path, **overrides: object) -> ServerArgs:
    return dataclasses.replace(ServerArgs(model=str(model)), **{**TINY_DEFAULTS, **overrides})


def synthetic_calibration(
    worker: ModelWorker,
    forward: LinearCost | None = None,
    host_schedule: float = 0.001,
    host_process: float = 0.0005,
) -> Calibration:
    """The worker's model facts with chosen costs (seconds)."""
    cfg = worker.model_config
    loop = LoopCost(
        forward or LinearCost(("one", "tokens"), (0.01, 0.0001)),
        LinearCost.constant(host_schedule),
        LinearCost.constant(host_process),
    )
    facts = ModelFacts(
        path=str(worker.args.model),
        vocab_size=cfg.vocab_size,
        eos_token_ids=list(worker.eos_token_ids),
        bytes_per_token=bytes_per_token(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, worker.kv_dtype),
        model_context_len=worker.pool.model_context_len,
        device="cpu",
        dtype="float32",
        attention_backend=worker.attention_backend_name,
        torch_threads=1,
        **window_facts(worker),
    )
    return Calibration(facts, cost_flag_values(worker.args), worker.pool.total_tokens,
                       StepCostModel({"normal": loop, "overlap": loop}), Startup(1.0, 2.0, 0.5),
                       kv_window_tokens=worker.pool.window_tokens)  # fmt: skip


Launch = tuple[tuple[int, int, int, bool], ...]  # (row, start, length, sample) per row


def rows_of(fi: ForwardInput) -> Launch:
    return tuple((r.row, r.start, r.length, r.sample) for r in fi.rows)


class RecordingScheduler:
    """The real scheduler over the real worker, with every launched batch's rows kept."""

    def __init__(self, scheduler: Scheduler, overlap: bool) -> None:
        self.scheduler = scheduler
        self.overlap = overlap
        self.launches: list[Launch] = []
        inner = scheduler.executor.submit

        def submit(fi: ForwardInput):  # type: ignore[no-untyped-def]
            self.launches.append(rows_of(fi))
            return inner(fi)

        scheduler.executor.submit = submit  # type: ignore[method-assign]

    def step(self) -> object:
        s = self.scheduler
        return s.step_overlap() if self.overlap else s.step()
