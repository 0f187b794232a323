"""The fitted step-time model: what a forward, and the scheduler's own work around it, cost
on the calibrated machine, as a function of the batch (`BatchFeatures`).

Each cost is linear in a few named terms with non-negative coefficients (seconds per unit):

    forward      = a + b·tokens + b'·max(0, tokens - knee) + c·decode_context_k
                   + d·prefill_attention_k + e·sampled_rows + f·decode_rows
    host_schedule = a + b·rows + c·prefill_tokens      (choosing the batch, building it)
    host_process  = a + b·rows                         (reading the result, emitting)

`tokens` are the positions the model computes (GEMM work; above `knee` the GEMMs are
compute-bound, below it the weights' reads dominate), `decode_context_k` and
`prefill_attention_k` the attention work in thousands of query-key pairs, `sampled_rows`
the rows whose logits are computed and sampled. One set per loop kind (`normal`,
`overlap`): in the overlap loop the forward runs on its own thread while the scheduler
works, and both share the machine's cores, so its forward is fitted on forwards measured
in that loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.sim.nnls import nnls

LOOPS = ("normal", "overlap")

_BASE_TERMS: dict[str, Callable[[BatchFeatures], float]] = {
    "one": lambda f: 1.0,
    "tokens": lambda f: float(f.tokens),
    "rows": lambda f: float(f.rows),
    "decode_rows": lambda f: float(f.decode_rows),
    "prefill_rows": lambda f: float(f.prefill_rows),
    "prefill_tokens": lambda f: float(f.prefill_tokens),
    "sampled_rows": lambda f: float(f.sampled_rows),
    "decode_context_k": lambda f: f.decode_context / 1000.0,
    "prefill_attention_k": lambda f: f.prefill_attention_k,
}

FORWARD_TERMS = (
    "one", "tokens", "decode_context_k", "prefill_attention_k", "sampled_rows", "decode_rows",
)  # fmt: skip
HOST_SCHEDULE_TERMS = ("one", "rows", "prefill_tokens")
HOST_PROCESS_TERMS = ("one", "rows")


def experts_term(num_experts: int, top_k: int) -> str:
    """The MoE forward's term: `experts_active:E:K`, the experts a batch's tokens activate
    per layer when each picks `top_k` of `num_experts` (uniformly, the expected count):
    E * (1 - (1 - K/E)^tokens). An expert's weights are read once per forward however many
    tokens it takes, so a small batch costs its active experts, not the dense MLP's size,
    and the cost stops growing once every expert is active."""
    return f"experts_active:{num_experts}:{top_k}"


def term_value(name: str, f: BatchFeatures) -> float:
    """A term's value; `tokens_over:K` is max(0, tokens - K), `experts_active:E:K` see
    `experts_term`."""
    if name.startswith("tokens_over:"):
        return float(max(0, f.tokens - int(name.split(":", 1)[1])))
    if name.startswith("experts_active:"):
        e, k = (int(x) for x in name.split(":")[1:])
        return e * (1.0 - (1.0 - k / e) ** f.tokens)
    try:
        return _BASE_TERMS[name](f)
    except KeyError:
        raise ValueError(f"unknown cost term {name!r}") from None


@dataclass(frozen=True)
class LinearCost:
    terms: tuple[str, ...]
    coef: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.terms) != len(self.coef):
            raise ValueError("one coefficient per term")
        for t in self.terms:
            term_value(t, BatchFeatures())  # unknown names fail here, not mid-simulation

    def predict(self, f: BatchFeatures) -> float:
        return sum(c * term_value(t, f) for t, c in zip(self.terms, self.coef, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {"terms": list(self.terms), "coef": list(self.coef)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LinearCost:
        return cls(tuple(d["terms"]), tuple(float(c) for c in d["coef"]))

    @classmethod
    def constant(cls, seconds: float) -> LinearCost:
        return cls(("one",), (seconds,))


@dataclass(frozen=True)
class LoopCost:
    forward: LinearCost
    host_schedule: LinearCost
    host_process: LinearCost

    def tick_seconds(self, f: BatchFeatures) -> float:
        """A normal-loop tick: schedule, forward, process, one after another."""
        return self.host_schedule.predict(f) + self.forward.predict(f) + self.host_process.predict(f)

    def to_dict(self) -> dict[str, Any]:
        return {
            "forward": self.forward.to_dict(),
            "host_schedule": self.host_schedule.to_dict(),
            "host_process": self.host_process.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoopCost:
        return cls(
            LinearCost.from_dict(d["forward"]),
            LinearCost.from_dict(d["host_schedule"]),
            LinearCost.from_dict(d["host_process"]),
        )


def fit_linear(
    features: Sequence[BatchFeatures], seconds: Sequence[float], terms: Sequence[str]
) -> LinearCost:
    """Non-negative least squares on relative error: each point weighs by 1/its seconds,
    so the many short decode steps count as much as the few long prefills."""
    if len(features) != len(seconds) or not features:
        raise ValueError("need as many (non-zero) measurements as batches")
    y = np.asarray(seconds, dtype=np.float64)
    y = np.maximum(y, 1e-6)
    a = np.array([[term_value(t, f) for t in terms] for f in features], dtype=np.float64)
    w = 1.0 / y
    coef = nnls(a * w[:, None], y * w)
    return LinearCost(tuple(terms), tuple(float(c) for c in coef))


@dataclass(frozen=True)
class FitError:
    """Relative errors |predicted - measured| / measured over a set of points."""

    points: int
    mean: float
    median: float
    p90: float
    max: float

    @classmethod
    def of(cls, cost: LinearCost, features: Sequence[BatchFeatures], seconds: Sequence[float]) -> FitError:
        if not features:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        pred = np.array([cost.predict(f) for f in features])
        y = np.maximum(np.asarray(seconds, dtype=np.float64), 1e-9)
        rel = np.abs(pred - y) / y
        return cls(len(rel), float(rel.mean()), float(np.median(rel)),
                   float(np.percentile(rel, 90)), float(rel.max()))  # fmt: skip

    def to_dict(self) -> dict[str, float]:
        return {"points": self.points, "mean": self.mean, "median": self.median,
                "p90": self.p90, "max": self.max}  # fmt: skip


def fit_forward(
    features: Sequence[BatchFeatures],
    seconds: Sequence[float],
    knees: Sequence[int] = (0, 16, 32, 64, 128, 256, 512),
    experts: tuple[int, int] | None = None,
) -> LinearCost:
    """The forward's model, with the GEMM knee that fits these points best (0: none);
    `experts` (num_experts, top_k): a mixture-of-experts model, which adds `experts_term`."""
    moe = (experts_term(*experts),) if experts else ()
    best: tuple[float, LinearCost] | None = None
    for knee in knees:
        terms = FORWARD_TERMS + moe + ((f"tokens_over:{knee}",) if knee else ())
        cost = fit_linear(features, seconds, terms)
        err = FitError.of(cost, features, seconds).mean
        if best is None or err < best[0] - 1e-9:
            best = (err, cost)
    assert best is not None
    return best[1]


@dataclass(frozen=True)
class ServingCost:
    """What the server's other processes add around the scheduler, measured through a real
    server (`sim.served`); all zero when not measured (the scheduler alone).

    - hand-over: from the client's send to the scheduler's inbox (HTTP, the tokenizer
      thread, ZeroMQ): `hand_over_s + hand_over_per_token_s * prompt tokens`, one request
      after another (one event loop, one tokenizer thread), so a burst reaches the
      scheduler spread out, and the first request of a burst is scheduled alone;
    - the return: a token's way from the forward that sampled it to the client
      (detokenizer, API server, the stream);
    - on each tick: the detokenizer, the API server and the client stream the tokens the
      tick produced on the same cores as the forward (`per_sampled_row_s` each), the
      scheduler sends its outputs and stats (`tick_s`), and the forward runs slower among
      the other processes (`forward_scale`).
    """

    hand_over_s: float = 0.0
    hand_over_per_token_s: float = 0.0
    return_s: float = 0.0
    forward_scale: float = 1.0
    tick_s: float = 0.0
    per_sampled_row_s: float = 0.0

    def hand_over(self, prompt_tokens: int) -> float:
        return self.hand_over_s + self.hand_over_per_token_s * prompt_tokens

    def tick_extra(self, f: BatchFeatures, forward_seconds: float) -> float:
        """Seconds a tick of these features takes in a server beyond the scheduler's own."""
        return (self.forward_scale - 1.0) * forward_seconds + self.tick_s + self.per_sampled_row_s * f.sampled_rows

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServingCost:
        return cls(**{k: float(v) for k, v in d.items()})


@dataclass(frozen=True)
class StepCostModel:
    loops: dict[str, LoopCost]

    def loop(self, overlap: bool) -> LoopCost:
        name = "overlap" if overlap else "normal"
        if name not in self.loops:
            raise ValueError(f"the calibration has no {name} loop; rerun `sluice calibrate`")
        return self.loops[name]

    def to_dict(self) -> dict[str, Any]:
        return {name: cost.to_dict() for name, cost in self.loops.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepCostModel:
        return cls({name: LoopCost.from_dict(v) for name, v in d.items()})
