"""The scheduler: one tick = take requests in, choose a batch, run it, process the result.

Choosing is prefill-first: if waiting requests (or the request being chunked) can be
admitted, the tick prefills them; otherwise it decodes the running set, retracting
requests first when the KV pool cannot give each its next slot. The ZeroMQ process loop
around this class lives in `process.py`; tests drive `step()` directly.

Two loops share every decision: `step()` (normal) runs a batch and processes its result in
the same tick; `step_overlap()` launches batch N on the forward thread, then processes
batch N-1's result while N runs. Requests whose prompt completes in a batch join the decode
set at launch, their next input read from the worker's future-token buffer; a request that
finishes in N-1 but was already placed in N has its extra token dropped, and its pages are
released only after N completes. Retraction needs the host's view of every request, so an
overlap tick that must retract first waits for the in-flight batch.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchTokenIDOut,
    FinishReason,
    SchedulerStats,
    TokenizedGenerateReq,
)
from sluice.runtime.model.forward_batch import ForwardMode
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow, needs_history
from sluice.runtime.scheduler.accounting import Counters, TickResult, TickTiming, token_output
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeManager, NewTokenRatio
from sluice.runtime.scheduler.policy import PolicyConfig, order_waiting
from sluice.runtime.scheduler.prefill import AddResult, PrefillAdder
from sluice.runtime.scheduler.request import Req, ReqState
from sluice.runtime.scheduler.stop_strings import StopStringMatcher

if TYPE_CHECKING:
    from sluice.runtime.engine.executor import Executor, ForwardResult

logger = logging.getLogger("sluice.scheduler")


class _NeedSync:
    """`_schedule` result: retraction is needed but a batch is in flight."""


NEED_SYNC = _NeedSync()


@dataclass
class InFlight:
    batch: ScheduledBatch
    result: Future[ForwardResult]


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int
    max_prefill_tokens: int
    chunk_size: int
    context_len: int
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    retraction_policy: str = "length"
    init_new_token_ratio: float = 0.7
    random_seed: int = 0
    check_integrity_when_idle: bool = True


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        cache: KVCacheManager,
        executor: Executor,
        eos_token_ids: list[int],
        decode_text: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.executor = executor
        self.inflight: InFlight | None = None
        self._deferred: list[Req] = []  # finished, but an in-flight batch still uses their KV
        self.timing = TickTiming()
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_matcher = StopStringMatcher(decode_text) if decode_text else None
        self.waiting: list[Req] = []
        self.chunked_req: Req | None = None
        self.decode = DecodeManager(cache, config.retraction_policy)
        self.ratio = NewTokenRatio(init=config.init_new_token_ratio)
        self.counters = Counters()
        self._rng = random.Random(config.random_seed)
        self._outbox: list[Req] = []
        self._by_rid: dict[str, Req] = {}
        self._ticks = 0
        self._queue_times: list[float] = []  # admitted since the last take_queue_times()

    # ---- intake -------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.chunked_req or self.decode.running or self.inflight)

    def live_requests(self) -> list[Req]:
        """Requests holding (or about to hold) KV pages and slots."""
        return list(self._by_rid.values()) + self._deferred

    def handle(self, msg: object) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.abort(msg.rid)
        else:
            logger.warning("scheduler ignored an unknown message %s", type(msg).__name__)

    def add_request(self, msg: TokenizedGenerateReq) -> None:
        sp = msg.sampling
        seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
        req = Req(
            rid=msg.rid,
            input_ids=list(msg.input_ids),
            sampling=sp,
            arrival_time=msg.arrival_time or time.time(),
            eos_token_ids=self.eos_token_ids,
            generator=torch.Generator().manual_seed(seed),
        )
        if msg.rid in self._by_rid:
            req.finish(FinishReason("abort", message=f"duplicate request id {msg.rid}"))
            self._outbox.append(req)
            return
        room = self.config.context_len - len(req.input_ids)
        if not req.input_ids or room < 1:
            req.finish(
                FinishReason(
                    "abort",
                    message=f"prompt of {len(req.input_ids)} tokens does not fit the context "
                    f"length {self.config.context_len}",
                )
            )
            logger.info("request rejected rid=%s reason=%s", req.rid, req.finish_reason.message)
            self._outbox.append(req)
            return
        if sp.max_new_tokens > room:
            sp.max_new_tokens = room
        self._by_rid[req.rid] = req
        self.waiting.append(req)

    def abort(self, rid: str) -> None:
        req = self._by_rid.get(rid)
        if req is not None:
            self._finish(req, FinishReason("abort", message="aborted by the client"))

    # ---- one tick -----------------------------------------------------------------------
    def step(self) -> TickResult | None:
        """Normal loop: choose a batch, run it and process its result. None when idle."""
        t0 = time.perf_counter()
        batch, retracted = self._schedule(allow_retract=True)
        t1 = time.perf_counter()
        if not isinstance(batch, ScheduledBatch):
            self.on_idle()
            self.timing.add(idle=t1 - t0)
            return None
        result = self._launch(batch).result()
        t2 = time.perf_counter()
        self._process_result(batch, result.output)
        self.timing.add(schedule=t1 - t0, forward=result.forward_seconds,
                        process=time.perf_counter() - t2, wait=t2 - t1 - result.forward_seconds)
        return TickResult(batch.mode, [r.rid for r in batch.reqs], batch.num_tokens, retracted)

    def step_overlap(self) -> TickResult | None:
        """Overlap loop: launch the next batch, then process the previous one's result."""
        t0 = time.perf_counter()
        batch, retracted = self._schedule(allow_retract=self.inflight is None)
        if batch is NEED_SYNC:
            self._complete(self._take_inflight())
            batch, retracted = self._schedule(allow_retract=True)
        t1 = time.perf_counter()
        previous = self._take_inflight()
        if isinstance(batch, ScheduledBatch):
            self.inflight = InFlight(batch, self._launch(batch))
        t2 = time.perf_counter()
        if previous is not None:
            self._complete(previous)  # records wait, forward and process time
        if not isinstance(batch, ScheduledBatch):
            if previous is None:
                self.on_idle()
            self.timing.add(idle=t1 - t0)
            return None
        self.timing.add(schedule=t1 - t0, launch=t2 - t1)
        return TickResult(batch.mode, [r.rid for r in batch.reqs], batch.num_tokens, retracted)

    def drain_inflight(self) -> None:
        """Process the in-flight batch's result, if any (overlap loop)."""
        self._complete(self._take_inflight())

    def _take_inflight(self) -> InFlight | None:
        inflight, self.inflight = self.inflight, None
        return inflight

    def _launch(self, batch: ScheduledBatch) -> Future[ForwardResult]:
        rows = self._sampling_rows(batch)
        for req, sampled in zip(batch.reqs, batch.sample_mask, strict=True):
            if sampled:
                req.pending_tokens += 1
        return self.executor.submit(batch, rows)

    def _complete(self, inflight: InFlight | None) -> None:
        if inflight is None:
            return
        t0 = time.perf_counter()
        result = inflight.result.result()
        t1 = time.perf_counter()
        self._process_result(inflight.batch, result.output)
        self.timing.add(wait=t1 - t0, forward=result.forward_seconds, process=time.perf_counter() - t1)
        still_used = set(map(id, self.inflight.batch.reqs)) if self.inflight else set()
        keep = []
        for req in self._deferred:
            if id(req) in still_used:
                keep.append(req)
            else:
                self.cache.release(req)
        self._deferred = keep

    def take_output(self) -> BatchTokenIDOut | None:
        """Tokens generated (and requests finished) since the last call, for the detokenizer."""
        if not self._outbox:
            return None
        reqs, self._outbox = self._outbox, []
        return token_output(reqs)

    def stats(self) -> SchedulerStats:
        total = self.cache.total_tokens
        used = total - self.cache.available_size
        c = self.counters
        return SchedulerStats(
            queue_requests=len(self.waiting),
            running_requests=len(self.decode.running) + (1 if self.chunked_req else 0),
            kv_token_usage=used / total if total else 0.0,
            new_token_ratio=self.ratio.value,
            retractions_total=c.retractions_total,
            retracted_tokens_total=c.retracted_tokens_total,
            prefix_cache_hit_ratio=(c.cached_prompt_tokens / c.prompt_tokens) if c.prompt_tokens else 0.0,
            max_total_tokens=total,
            free_tokens=self.cache.available_size,
            cached_tokens=self.cache.cached_size,
        )

    def take_queue_times(self) -> list[float]:
        """Seconds each request admitted since the last call waited (arrival to its first
        admission into a batch; re-admissions after a retraction are not counted)."""
        times, self._queue_times = self._queue_times, []
        return times

    def check_integrity(self) -> None:
        self.cache.check_integrity(self.live_requests())

    # ---- choosing a batch ---------------------------------------------------------------
    def _schedule(self, allow_retract: bool) -> tuple[ScheduledBatch | _NeedSync | None, list[str]]:
        batch = self._schedule_prefill()
        if batch is not None:
            return batch, []
        return self._schedule_decode(allow_retract)

    def _schedule_prefill(self) -> ScheduledBatch | None:
        if not self.waiting and self.chunked_req is None:
            return None
        adder = PrefillAdder(
            cache=self.cache,
            token_budget=self.config.max_prefill_tokens,
            chunk_size=self.config.chunk_size,
            running_reserved=self.decode.reserved_tokens(self.ratio.value),
        )
        self._ticks += 1
        candidates = ([self.chunked_req] if self.chunked_req else []) + order_waiting(
            self.waiting, self.config.policy, self.cache.radix, self._ticks
        )
        prefix_lens: list[int] = []
        slots: list[torch.Tensor] = []
        for req in candidates:
            result = adder.try_add(req)
            if result not in (AddResult.ADDED, AddResult.CHUNKED):
                break
            start = req.kv_len
            if req.state is ReqState.WAITING and req.retractions == 0:
                req.cached_tokens = start
            loc = self.cache.extend(req, start + adder.extend_lens[-1])
            if loc is None:  # the pool is shorter than the estimate said: stop here
                adder.reqs.pop()
                adder.extend_lens.pop()
                if req is not self.chunked_req:
                    self.cache.release(req)
                break
            prefix_lens.append(start)
            slots.append(loc)
            if result is AddResult.CHUNKED:
                break
        if not adder.reqs:
            if self.chunked_req is not None and not self.decode.running:
                self._finish(self.chunked_req, FinishReason("abort", message="KV pool exhausted"))
                self.chunked_req = None
            return None
        for req in adder.reqs:
            if req in self.waiting:
                self.waiting.remove(req)
                if req.retractions == 0:
                    self.counters.prompt_tokens += len(req.input_ids)
                    self.counters.cached_prompt_tokens += req.cached_tokens
                    self._queue_times.append(max(0.0, time.time() - req.arrival_time))
            req.state = ReqState.PREFILLING
        self.chunked_req = adder.chunked
        mask = [r is not adder.chunked for r in adder.reqs]
        # prompts completing here decode next; their first token is read as a future
        self.decode.add([r for r, sampled in zip(adder.reqs, mask, strict=True) if sampled])
        return ScheduledBatch(
            ForwardMode.EXTEND, list(adder.reqs), prefix_lens, list(adder.extend_lens), torch.cat(slots), mask
        )

    def _schedule_decode(self, allow_retract: bool) -> tuple[ScheduledBatch | _NeedSync | None, list[str]]:
        # a request whose last token is in flight may finish with it: do not run past that
        reqs = [r for r in self.decode.running if r.generated < r.sampling.max_new_tokens]
        if not reqs:
            return None, []
        short = self.cache.decode_pages_needed(reqs) * self.cache.page_size > self.cache.available_size
        if short and not allow_retract:
            return NEED_SYNC, []
        retracted = self.decode.retract_until_fits() if short else []
        if retracted:
            freed = sum(r.seq_len for r in retracted)
            before = self.ratio.value
            self.ratio.after_retraction(self.decode.running)
            self.counters.retractions_total += len(retracted)
            self.counters.retracted_tokens_total += freed
            self.waiting[:0] = retracted
            logger.info(
                "retracted requests=%d tokens=%d running=%d new_token_ratio=%.3f->%.3f",
                len(retracted), freed, len(self.decode.running), before, self.ratio.value,
            )
        else:
            self.ratio.step()
        reqs = [r for r in self.decode.running if r.generated < r.sampling.max_new_tokens]
        prefix_lens, slots = [], []
        for req in reqs:
            prefix_lens.append(req.kv_len)
            loc = self.cache.extend(req, req.kv_len + 1)
            if loc is None:  # a lone request larger than the pool: cannot happen after clipping
                raise RuntimeError(f"KV pool cannot hold request {req.rid}")
            slots.append(loc)
        batch = ScheduledBatch(
            ForwardMode.DECODE, reqs, prefix_lens, [1] * len(reqs), torch.cat(slots), [True] * len(reqs)
        )
        return batch, [r.rid for r in retracted]

    def _sampling_rows(self, batch: ScheduledBatch) -> list[SamplingRow]:
        rows = []
        for req, sample in zip(batch.reqs, batch.sample_mask, strict=True):
            banned: tuple[int, ...] = ()
            if sample and req.generated < req.sampling.min_new_tokens:
                banned = tuple(sorted(set(req.sampling.stop_token_ids) | (
                    set() if req.sampling.ignore_eos else set(self.eos_token_ids))))
            row = SamplingRow(req.sampling, req.input_ids, [], req.generator, banned)
            if needs_history(row):  # a snapshot: the list grows while the forward runs
                row = SamplingRow(req.sampling, req.input_ids, list(req.output_ids), req.generator, banned)
            rows.append(row)
        return rows

    # ---- processing the result ----------------------------------------------------------
    def _process_result(self, batch: ScheduledBatch, out: SampleOutput) -> None:
        for i, req in enumerate(batch.reqs):
            if batch.mode is ForwardMode.EXTEND and not req.is_finished:
                # a computed prompt (or chunk) is shareable at once, not only when it finishes
                self.cache.cache_unfinished(req, batch.prefix_lens[i] + batch.extend_lens[i])
            if not batch.sample_mask[i]:  # an intermediate chunk emits no token
                continue
            req.pending_tokens -= 1
            if req.is_finished:  # finished or aborted while this forward ran: drop the token
                continue
            token = out.token_ids[i]
            req.output_ids.append(token)
            if req.sampling.logprobs:
                req.output_logprobs.append(out.logprobs[i] if out.logprobs[i] is not None else 0.0)
            self.counters.generated_tokens += 1
            req.check_finished_after(token)
            if not req.is_finished and self.stop_matcher and req.sampling.stop:
                self.stop_matcher.check(req)
            if req.is_finished:
                self._finish(req, req.finish_reason)
            else:
                self._outbox.append(req)

    def _finish(self, req: Req, reason: FinishReason | None) -> None:
        """End a request in any state; its slot and pages go back exactly once (after the
        in-flight batch, if that batch still uses them)."""
        req.finish(reason or FinishReason("abort"))
        if req in self.waiting:
            self.waiting.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.decode.running:
            self.decode.remove(req)
        self._by_rid.pop(req.rid, None)
        self._outbox.append(req)
        if self.inflight is not None and any(r is req for r in self.inflight.batch.reqs):
            self._deferred.append(req)
        else:
            self.cache.release(req)

    def on_idle(self) -> None:
        """With nothing left to run: reset new_token_ratio and check the books."""
        if not self.has_work and not self._deferred:
            self.ratio.reset()
            if self.config.check_integrity_when_idle:
                self.check_integrity()
