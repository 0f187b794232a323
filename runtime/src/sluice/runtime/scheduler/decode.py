"""The decode set: requests that generate one token per tick, and retraction.

Before a decode tick every running request needs one KV slot for its next token. When the
pool cannot give them, requests are retracted (by default fewest generated tokens first,
then longest prompt) until the rest fit: their KV is released, their generated tokens are
kept, and they go back to the head of the waiting queue to be re-prefilled later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req, ReqState

# After a retraction, assume each surviving request decodes at least this many more
# tokens when re-estimating new_token_ratio (SGLang's RETRACT_DECODE_STEPS).
RETRACT_DECODE_STEPS = 20


@dataclass
class NewTokenRatio:
    """Expected fraction of a running request's remaining max_new_tokens it will still use.

    Starts at `init`, decays linearly per decode tick to `init * 0.14` over `decay_ticks`,
    resets to `init` when the scheduler is idle, and is re-estimated after a retraction.
    """

    init: float = 0.7
    min_factor: float = 0.14
    decay_ticks: int = 600
    value: float = -1.0

    def __post_init__(self) -> None:
        if self.value < 0:
            self.value = self.init

    @property
    def floor(self) -> float:
        return self.init * self.min_factor

    @property
    def decay(self) -> float:
        return (self.init - self.floor) / self.decay_ticks

    def step(self) -> None:
        self.value = max(self.floor, self.value - self.decay)

    def reset(self) -> None:
        self.value = self.init

    def after_retraction(self, survivors: list[Req]) -> None:
        decoded = sum(len(r.output_ids) for r in survivors)
        max_new = sum(r.sampling.max_new_tokens for r in survivors)
        if max_new == 0:
            self.value = self.init
            return
        estimate = (decoded + RETRACT_DECODE_STEPS * len(survivors)) / max_new
        self.value = min(1.0, max(self.floor, estimate))


def retraction_order(policy: str) -> Callable[[Req], Any]:
    """Sort key: requests retracted first come first."""
    if policy == "length":  # fewest generated tokens first, then longest prompt
        return lambda r: (len(r.output_ids), -len(r.input_ids))
    if policy == "newest":
        return lambda r: -r.arrival_time
    raise ValueError(f"unknown retraction policy {policy!r}")


@dataclass
class DecodeManager:
    cache: KVCacheManager
    retraction_policy: str = "length"
    running: list[Req] = field(default_factory=list)

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    def add(self, reqs: list[Req]) -> None:
        for r in reqs:
            r.state = ReqState.RUNNING
            self.running.append(r)

    def remove(self, req: Req) -> None:
        self.running.remove(req)

    def reserved_tokens(self, ratio: float) -> float:
        """Tokens the running requests are expected to still need."""
        return sum(r.remaining_new_tokens for r in self.running) * ratio

    def retract_until_fits(self) -> list[Req]:
        """Retract running requests until the rest can each get their next KV slot.

        Returns the retracted requests (their KV and slot released, generated tokens kept),
        in the order they should re-enter the head of the waiting queue.
        """
        retracted: list[Req] = []
        key = retraction_order(self.retraction_policy)
        ps = self.cache.page_size
        while self.running and (
            self.cache.decode_pages_needed(self.running) * ps > self.cache.available_size
        ):
            if len(self.running) == 1:
                break  # the last request alone cannot fit: the caller must fail it
            victim = min(self.running, key=key)
            self.running.remove(victim)
            self.cache.release(victim)
            victim.state = ReqState.WAITING
            victim.retractions += 1
            retracted.append(victim)
        # the request retracted last is the one with most progress: it goes first
        return retracted[::-1]
