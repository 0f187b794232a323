"""What the scheduler reports about its own work: per-tick results, counters, timing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.forward import ForwardMode
from sluice.runtime.ipc.messages import (
    BatchTokenIDOut,
    DetokenizeParams,
    SchedulerStats,
    TokenUpdate,
)
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.prefill import PrefillBatch
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
    computed_prompt_tokens: int = 0  # positions those ticks computed (cached ones are not)
    failed_batches: int = 0  # forwards that raised
    integrity_checks: int = 0  # pool integrity checks passed
    # seconds each request admitted since the last take_queue_times() waited in the queue
    queue_times: list[float] = field(default_factory=list)

    def prefilled(self, batch: PrefillBatch, now: float) -> None:
        """Count a prefill batch: how long each request it admitted (`batch.admitted`)
        waited in the queue, and their cached prompt tokens."""
        self.prefill_batches += 1
        self.prefill_rows += len(batch.reqs)
        self.computed_prompt_tokens += batch.num_tokens
        for req, start in zip(batch.reqs, batch.starts, strict=True):
            if req in batch.admitted:
                req.cached_tokens = start
                self.prompt_tokens += len(req.input_ids)
                self.cached_prompt_tokens += start
                self.queue_times.append(max(0.0, now - req.arrival_time))

    def take_queue_times(self) -> list[float]:
        times, self.queue_times = self.queue_times, []
        return times


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


def stats_of(
    c: Counters,
    cache: KVCacheManager,
    waiting: int,
    running: list[Req],
    new_token_ratio: float,
    adapters: dict[str, Any],
) -> SchedulerStats:
    """The scheduler's published stats: `running` the decoding requests and the one being
    chunked, `adapters` what `AdapterGate.stats` says of them."""
    total = cache.total_tokens
    used = total - cache.available_size
    window = cache.window
    window_usage = window.attached / window.allocator.num_pages if window is not None else 0.0
    kv_usage = used / total if total else 0.0
    if window is not None and window.holds_all_layers:
        # the full pool holds keys only: the live windows are the KV in use (cached windows
        # no live request reads are taken back when needed, as cached pages are)
        kv_usage = cache.live_window_count() / window.allocator.num_pages
    return SchedulerStats(
        queue_requests=waiting,
        running_requests=len(running),
        kv_token_usage=kv_usage,
        new_token_ratio=new_token_ratio,
        retractions_total=c.retractions_total,
        retracted_tokens_total=c.retracted_tokens_total,
        prefix_cache_hit_ratio=(c.cached_prompt_tokens / c.prompt_tokens) if c.prompt_tokens else 0.0,
        max_total_tokens=total,
        free_tokens=cache.available_size,
        cached_tokens=cache.cached_size,
        swa_total_tokens=window.allocator.size if window is not None else 0,
        swa_token_usage=window_usage,
        prefill_batches_total=c.prefill_batches,
        prefill_rows_total=c.prefill_rows,
        computed_prompt_tokens_total=c.computed_prompt_tokens,
        failed_batches_total=c.failed_batches,
        integrity_checks_total=c.integrity_checks,
        **adapters,
    )
