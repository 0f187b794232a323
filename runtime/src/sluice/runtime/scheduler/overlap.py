"""What is in flight: the launched batch whose result is not processed yet, and the finished
requests whose pages it still uses.

The normal loop processes each batch right after launching it; the overlap loop launches
batch N before processing N-1, so while N runs:

- a request sampled in N has one token more than the host has seen (`tokens_in_flight`):
  it counts towards max_new_tokens and min_new_tokens when N+1 is scheduled;
- a request that finishes while N-1 is processed may be in N: its slot and pages are
  released only after N completes (`defer_release`), and N's token for it is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.engine.executor import PendingOutput
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.request import Req


@dataclass(frozen=True)
class Launched:
    batch: ScheduledBatch
    result: PendingOutput


@dataclass
class InFlight:
    launched: Launched | None = None
    deferred: list[Req] = field(default_factory=list)
    _uses: set[int] = field(default_factory=set)
    _samples: set[int] = field(default_factory=set)

    def launch(self, batch: ScheduledBatch, result: PendingOutput) -> None:
        assert self.launched is None, "one batch in flight at a time"
        self.launched = Launched(batch, result)
        self._uses = {id(r) for r in batch.reqs}
        self._samples = {id(r) for r, s in zip(batch.reqs, batch.sample, strict=True) if s}

    def take(self) -> Launched | None:
        launched, self.launched = self.launched, None
        self._uses, self._samples = set(), set()
        return launched

    def tokens_in_flight(self, req: Req) -> int:
        return 1 if id(req) in self._samples else 0

    def release_or_defer(self, req: Req, cache: KVCacheManager) -> None:
        if id(req) in self._uses:
            self.deferred.append(req)
        else:
            cache.release(req)

    def release_unused(self, cache: KVCacheManager) -> None:
        """Release the deferred requests the launched batch (if any) does not use."""
        keep = []
        for req in self.deferred:
            if id(req) in self._uses:
                keep.append(req)
            else:
                cache.release(req)
        self.deferred = keep
