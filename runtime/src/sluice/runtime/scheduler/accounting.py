"""What the scheduler reports about its own work: per-tick results, counters, timing."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.forward import ForwardMode
from sluice.runtime.ipc.messages import BatchTokenIDOut, DetokenizeParams, TokenUpdate
from sluice.runtime.scheduler.request import Req


@dataclass
class TickResult:
    """What one tick ran, for tests and the per-tick log."""

    mode: ForwardMode
    rids: list[str]  # the decode rows first, then the prefill rows
    num_tokens: int
    retracted: list[str] = field(default_factory=list)
    num_decode: int = 0


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
    prefill_batches: int = 0  # ticks that prefilled something
    prefill_rows: int = 0  # requests (or chunks) those ticks prefilled
    failed_batches: int = 0  # forwards that raised
    integrity_checks: int = 0  # pool integrity checks passed


def token_output(reqs: list[Req]) -> BatchTokenIDOut:
    """New tokens (and finish reasons) of `reqs` since they were last reported, one update
    per request; marks what it reports as sent."""
    seen: set[int] = set()
    updates = []
    for r in reqs:
        if id(r) in seen:
            continue
        seen.add(id(r))
        first = r.sent_len == 0 and not r.announced
        updates.append(
            TokenUpdate(
                rid=r.rid,
                new_token_ids=r.output_ids[r.sent_len :],
                logprobs=r.output_logprobs[r.sent_len :] if r.sampling.logprobs else [],
                finished=r.finish_reason,
                prompt_tokens=len(r.input_ids),
                completion_tokens=len(r.output_ids),
                cached_tokens=r.cached_tokens,
                detokenize=DetokenizeParams(
                    r.sampling.skip_special_tokens,
                    list(r.sampling.stop),
                    r.sampling.spaces_between_special_tokens,
                    r.sampling.min_new_tokens,
                )
                if first
                else None,
                top_logprob_ids=[ids for ids, _ in r.output_top_logprobs[r.sent_len :]],
                top_logprob_values=[vals for _, vals in r.output_top_logprobs[r.sent_len :]],
                input_token_logprobs=list(r.input_logprobs) if first else [],
            )
        )
        r.sent_len = len(r.output_ids)
        r.announced = True
    return BatchTokenIDOut(updates)
