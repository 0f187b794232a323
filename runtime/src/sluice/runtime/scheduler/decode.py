"""The decode set: `DecodeManager` owns the running requests, the new-token ratio and
retraction, and builds each tick's decode rows with `schedule()`.

Every running request needs one KV slot for its next token. When the pool cannot give them,
requests are retracted (by default fewest generated tokens first, then longest prompt)
until the rest fit: their KV is released, their generated tokens are kept, and the
scheduler puts them back at the head of the waiting queue to be re-prefilled later. A lone
request that still cannot get its slot is given up on (the scheduler fails it), never
crashes the scheduler.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import CLIP_MAX_NEW_TOKENS, Req

# After a retraction, assume each surviving request decodes at least this many more
# tokens when re-estimating new_token_ratio (SGLang's RETRACT_DECODE_STEPS).
RETRACT_DECODE_STEPS = 20


@dataclass
class NewTokenRatio:
    """Expected fraction of a running request's remaining (clipped) max_new_tokens it will
    still use.

    Starts at `init`, decays linearly per decode tick to `init * 0.14` over `decay_ticks`,
    resets to `init` when the scheduler is idle, and is re-estimated after a retraction
    (never lowered by one: a retraction means the estimate was too low).
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

    @staticmethod
    def estimate_after_retraction(survivors: list[Req]) -> float:
        """SGLang's estimate, with each max_new_tokens clipped as everywhere else."""
        decoded = sum(len(r.output_ids) for r in survivors)
        max_new = sum(min(r.sampling.max_new_tokens, CLIP_MAX_NEW_TOKENS) for r in survivors)
        if max_new == 0:
            return 1.0
        return (decoded + RETRACT_DECODE_STEPS * len(survivors)) / max_new

    def after_retraction(self, survivors: list[Req]) -> None:
        self.value = min(1.0, max(self.value, self.estimate_after_retraction(survivors)))


def retraction_order(policy: str) -> Callable[[Req], Any]:
    """Sort key: requests retracted first come first."""
    if policy == "length":  # fewest generated tokens first, then longest prompt
        return lambda r: (len(r.output_ids), -len(r.input_ids))
    if policy == "newest":
        return lambda r: -r.arrival_time
    raise ValueError(f"unknown retraction policy {policy!r}")


@dataclass(frozen=True)
class Retraction:
    """What one retraction did: who went back to the queue (head first), and the ratio."""

    reqs: list[Req]
    freed_tokens: int
    ratio_before: float
    ratio_after: float


class NeedSync(enum.Enum):
    """`schedule()` could not decide: a retraction is needed, but a launched forward still
    has tokens the scheduler has not seen (overlap loop); wait for it and ask again."""

    NEED_SYNC = "need_sync"


@dataclass
class DecodeRows:
    """This tick's decode rows (KV slots allocated), and what it cost to get them."""

    reqs: list[Req]
    retraction: Retraction | None = None
    given_up: list[Req] = field(default_factory=list)  # could not fit even alone


@dataclass
class DecodeManager:
    cache: KVCacheManager
    ratio: NewTokenRatio
    retraction_policy: str = "length"
    running: dict[int, Req] = field(default_factory=dict)  # admission order

    @property
    def runnable(self) -> bool:
        return bool(self.running)

    def add(self, reqs: list[Req]) -> None:
        for r in reqs:
            self.running[id(r)] = r

    def remove(self, req: Req) -> bool:
        return self.running.pop(id(req), None) is not None

    def __contains__(self, req: Req) -> bool:
        return id(req) in self.running

    def reserved_tokens(self) -> float:
        """KV tokens the running requests are expected to still need."""
        return sum(r.clipped_remaining_new_tokens for r in self.running.values()) * self.ratio.value

    def schedule(
        self, in_flight: Callable[[Req], int], allow_retract: bool
    ) -> DecodeRows | NeedSync | None:
        """One KV slot for each running request that may still generate, retracting when the
        pool is short; `in_flight(req)` is how many of its tokens a launched forward is still
        sampling (they count towards max_new_tokens)."""

        def decodable() -> list[Req]:
            return [
                r
                for r in self.running.values()
                if len(r.output_ids) + in_flight(r) < r.sampling.max_new_tokens
            ]

        reqs = decodable()
        if not reqs:
            return None
        ps = self.cache.page_size
        short = self.cache.decode_pages_needed(reqs) * ps > self.cache.available_size
        if short and not allow_retract:
            return NeedSync.NEED_SYNC
        retraction = self._retract_until_fits() if short else None
        if retraction is None:
            self.ratio.step()
        given_up = []
        for r in decodable():
            if not self.cache.extend(r, self.cache.kv_len(r) + 1):  # alone and still too big for the pool
                self.remove(r)
                given_up.append(r)
        return DecodeRows(decodable(), retraction, given_up)

    def running_with_chunk(self, chunked: Req | None) -> list[Req]:
        """The running set, and the request whose prompt is mid-chunk (`chunked`)."""
        return [*self.running.values(), *([chunked] if chunked is not None else [])]

    def outranked_by(self, head: Req, fits: Callable[[], bool]) -> bool:
        """The most important waiting request (`head`) does not fit, and a less important
        one runs (priority scheduling preempts it)."""
        if fits():
            return False
        return any(r.sampling.priority > head.sampling.priority for r in self.running.values())

    def preempt_for(self, head: Req, fits: Callable[[], bool]) -> Retraction:
        return self.preempt(lambda r: r.sampling.priority > head.sampling.priority, fits)

    def preempt(self, outranked: Callable[[Req], bool], fits: Callable[[], bool]) -> Retraction:
        """Retract running requests `outranked` (a more important one waits), least
        important and then newest first, until `fits()`; they go back to the queue."""
        before = self.ratio.value
        victims = sorted(
            (r for r in self.running.values() if outranked(r)),
            key=lambda r: (-r.sampling.priority, -r.arrival_time),
        )
        retracted, freed = [], 0
        while victims and not fits():
            victim = victims.pop(0)
            self.remove(victim)
            freed += self.cache.kv_len(victim)
            self.cache.release(victim)
            victim.retractions += 1
            retracted.append(victim)
        return Retraction(retracted, freed, before, self.ratio.value)

    def _retract_until_fits(self) -> Retraction:
        before = self.ratio.value
        retracted: list[Req] = []
        freed = 0
        key = retraction_order(self.retraction_policy)
        ps = self.cache.page_size
        while len(self.running) > 1 and (
            self.cache.decode_pages_needed(list(self.running.values())) * ps
            > self.cache.available_size
        ):
            victim = min(self.running.values(), key=key)
            self.remove(victim)
            retracted.append(victim)
            freed += self.cache.kv_len(victim)
            self.cache.release(victim)
            victim.retractions += 1
        self.ratio.after_retraction(list(self.running.values()))
        # the request retracted last is the one with most progress: it goes first
        return Retraction(retracted[::-1], freed, before, self.ratio.value)
