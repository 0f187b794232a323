"""A test-only `Executor` wrapper that makes chosen forwards fail. Off in production.

Tests of fault isolation need a forward that raises at a point they choose, in a real
server. Off unless the scheduler process starts with `SLUICE_TEST_FAULTS` set (read once,
by the process's composition root, like the hold gate), which then wraps the scheduler's
executor in a `FaultInjectingExecutor`: each forward is checked as it is submitted (in
forward order), runs all the same (its KV is written), and reading its result raises (the
result is lost). Comma-separated triggers:

- `forward_token=T`: a forward computing a prompt that holds token id T raises;
- `forward_call=K`: the K-th forward since the process started raises (1-based; the
  server's warm-up generation counts);
- `sample_seed=S`: a forward sampling a row whose seed is S raises (the sampler failing
  for one row loses its whole batch);
- `fatal_token=T`: like `forward_token`, but the fault is unrecoverable (what a CUDA
  error is): the server answers every client and exits non-zero.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from sluice.runtime.engine.engine_faults import EngineUnusable
from sluice.runtime.engine.executor import Executor, ExecutorWrapper, PendingOutput
from sluice.runtime.engine.forward_input import ForwardInput, ForwardOutput

ENV_FAULTS = "SLUICE_TEST_FAULTS"
TRIGGERS = ("forward_token", "forward_call", "sample_seed", "fatal_token")


class InjectedFault(RuntimeError):
    """A recoverable fault raised on purpose."""


class InjectedFatalFault(EngineUnusable):
    """An unrecoverable fault raised on purpose."""


@dataclass
class FaultPlan:
    forward_token: int | None = None
    forward_call: int | None = None
    sample_seed: int | None = None
    fatal_token: int | None = None
    calls: int = field(default=0, compare=False)

    @classmethod
    def parse(cls, spec: str) -> FaultPlan:
        values: dict[str, int] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, sep, value = item.partition("=")
            if not sep or name not in TRIGGERS:
                raise ValueError(f"{ENV_FAULTS}: {item!r} is not one of {', '.join(TRIGGERS)}=N")
            values[name] = int(value)
        return cls(**values)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FaultPlan | None:
        spec = (os.environ if environ is None else environ).get(ENV_FAULTS, "")
        return cls.parse(spec) if spec else None

    def check(self, fi: ForwardInput) -> None:
        """Raise if this forward is one the plan fails."""
        self.calls += 1
        tokens = {t for row in fi.rows for t in row.tokens}
        if self.fatal_token is not None and self.fatal_token in tokens:
            raise InjectedFatalFault(f"injected unrecoverable fault (token {self.fatal_token})")
        if self.forward_token is not None and self.forward_token in tokens:
            raise InjectedFault(f"injected forward fault (token {self.forward_token})")
        if self.forward_call == self.calls:
            raise InjectedFault(f"injected forward fault (forward {self.calls})")
        if self.sample_seed is not None and any(
            s.params.seed == self.sample_seed for s in fi.sampling
        ):
            raise InjectedFault(f"injected sampler fault (a row with seed {self.sample_seed})")


class _Failing:
    """A forward that ran but whose result is lost: reading it raises `error` (or what the
    forward itself raised, which came first)."""

    def __init__(self, pending: PendingOutput, error: Exception) -> None:
        self.pending = pending
        self.error = error

    def result(self) -> ForwardOutput:
        self.pending.result()
        raise self.error


class FaultInjectingExecutor(ExecutorWrapper):
    """`inner`, with the forwards `plan` picks failing. With tensor parallelism
    (`group_size` > 1) every fault is unrecoverable, as a real one is (the model worker's
    rule: one rank cannot drop a batch alone)."""

    def __init__(self, inner: Executor, plan: FaultPlan, group_size: int = 1) -> None:
        super().__init__(inner)
        self.plan = plan
        self.group_size = group_size

    def submit(self, fi: ForwardInput) -> PendingOutput:
        pending = self.inner.submit(fi)
        try:
            self.plan.check(fi)
        except InjectedFault as fault:
            error: Exception = fault
            if self.group_size > 1:
                error = EngineUnusable(f"{type(fault).__name__}: {fault}")
            return _Failing(pending, error)
        except InjectedFatalFault as fault:
            return _Failing(pending, fault)
        return pending
