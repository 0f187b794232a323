"""What the scheduler reports about its own work: per-tick results, counters, timing."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.ipc.messages import BatchTokenIDOut
from sluice.runtime.model.forward_batch import ForwardMode
from sluice.runtime.scheduler.request import Req


@dataclass
class TickResult:
    """What one tick ran, for tests and the per-tick log."""

    mode: ForwardMode
    rids: list[str]
    num_tokens: int
    retracted: list[str] = field(default_factory=list)


@dataclass
class TickTiming:
    """Where the scheduler's wall time goes (seconds, summed since the last `take`)."""

    schedule: float = 0.0
    launch: float = 0.0
    forward: float = 0.0  # on the forward thread in the overlap loop
    wait: float = 0.0  # blocked on a forward result
    process: float = 0.0
    idle: float = 0.0
    ticks: int = 0

    def add(self, **seconds: float) -> None:
        for name, value in seconds.items():
            setattr(self, name, getattr(self, name) + value)
        if "schedule" in seconds or "idle" in seconds:  # once per tick
            self.ticks += 1

    def take(self) -> TickTiming:
        snapshot = TickTiming(**vars(self))
        for name in vars(self):
            setattr(self, name, 0 if name == "ticks" else 0.0)
        return snapshot

    def summary(self) -> str:
        n = max(self.ticks, 1)
        parts = [f"{k}={1000 * v / n:.2f}ms" for k, v in vars(self).items() if k != "ticks"]
        return f"ticks={self.ticks} per-tick " + " ".join(parts)


@dataclass
class Counters:
    retractions_total: int = 0
    retracted_tokens_total: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0


def token_output(reqs: list[Req]) -> BatchTokenIDOut:
    """New tokens (and finish reasons) of `reqs` since they were last reported, one entry
    per request; marks what it reports as sent."""
    seen: set[str] = set()
    out = BatchTokenIDOut([], [], [], [], [], [], [], [], [])
    for r in reqs:
        if r.rid in seen:
            continue
        seen.add(r.rid)
        out.rids.append(r.rid)
        out.new_token_ids.append(r.output_ids[r.sent_len :])
        out.logprobs.append(r.output_logprobs[r.sent_len :] if r.sampling.logprobs else [])
        r.sent_len = len(r.output_ids)
        out.finished.append(r.finish_reason)
        out.prompt_tokens.append(len(r.input_ids))
        out.completion_tokens.append(len(r.output_ids))
        out.cached_tokens.append(r.cached_tokens)
        out.skip_special_tokens.append(r.sampling.skip_special_tokens)
        out.stop_strings.append(list(r.sampling.stop))
    return out
