"""The scheduler: one tick = take requests in, choose a batch, run it, process the result.

Choosing is prefill-first: if waiting requests (or the request being chunked) can be
admitted, the tick prefills them; otherwise it decodes the running set, retracting
requests first when the KV pool cannot give each its next slot. The ZeroMQ process loop
around this class lives in `process.py`; tests drive `step()` directly.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchTokenIDOut,
    FinishReason,
    SchedulerStats,
    TokenizedGenerateReq,
)
from sluice.runtime.model.forward_batch import ForwardMode
from sluice.runtime.sampling.sampler import SampleOutput, SamplingRow
from sluice.runtime.scheduler.batch import ScheduledBatch
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeManager, NewTokenRatio
from sluice.runtime.scheduler.policy import PolicyConfig, order_waiting
from sluice.runtime.scheduler.prefill import AddResult, PrefillAdder
from sluice.runtime.scheduler.request import Req, ReqState
from sluice.runtime.scheduler.stop_strings import StopStringMatcher

logger = logging.getLogger("sluice.scheduler")

ForwardFn = Callable[[ScheduledBatch, list[SamplingRow]], SampleOutput]


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


@dataclass
class TickResult:
    """What one tick ran, for tests and the per-tick log."""

    mode: ForwardMode
    rids: list[str]
    num_tokens: int
    retracted: list[str] = field(default_factory=list)


@dataclass
class Counters:
    retractions_total: int = 0
    retracted_tokens_total: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        cache: KVCacheManager,
        forward: ForwardFn,
        eos_token_ids: list[int],
        decode_text: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.config = config
        self.cache = cache
        self.forward = forward
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
        return bool(self.waiting or self.chunked_req or self.decode.running)

    def live_requests(self) -> list[Req]:
        return list(self._by_rid.values())

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
        if req is None:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if req.state is ReqState.RUNNING:
            self.decode.remove(req)
        self._finish(req, FinishReason("abort", message="aborted by the client"))

    # ---- one tick -----------------------------------------------------------------------
    def step(self) -> TickResult | None:
        """Choose a batch, run it and process its result. None when there was nothing to run."""
        batch, retracted = self._schedule()
        if batch is None:
            self._on_idle()
            return None
        out = self.forward(batch, self._sampling_rows(batch))
        self._process_result(batch, out)
        return TickResult(batch.mode, [r.rid for r in batch.reqs], batch.num_tokens, retracted)

    def take_output(self) -> BatchTokenIDOut | None:
        """Tokens generated (and requests finished) since the last call, for the detokenizer."""
        if not self._outbox:
            return None
        reqs, self._outbox = self._outbox, []
        seen: set[str] = set()
        out = BatchTokenIDOut([], [], [], [], [], [], [], [], [])
        for r in reqs:
            if r.rid in seen:
                continue
            seen.add(r.rid)
            new = r.output_ids[r.sent_len :]
            out.rids.append(r.rid)
            out.new_token_ids.append(new)
            out.logprobs.append(r.output_logprobs[r.sent_len :] if r.sampling.logprobs else [])
            r.sent_len = len(r.output_ids)
            out.finished.append(r.finish_reason)
            out.prompt_tokens.append(len(r.input_ids))
            out.completion_tokens.append(len(r.output_ids))
            out.cached_tokens.append(r.cached_tokens)
            out.skip_special_tokens.append(r.sampling.skip_special_tokens)
            out.stop_strings.append(list(r.sampling.stop))
        return out

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
    def _schedule(self) -> tuple[ScheduledBatch | None, list[str]]:
        batch = self._schedule_prefill()
        if batch is not None:
            return batch, []
        return self._schedule_decode()

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
        return ScheduledBatch(
            ForwardMode.EXTEND, list(adder.reqs), prefix_lens, list(adder.extend_lens), torch.cat(slots), mask
        )

    def _schedule_decode(self) -> tuple[ScheduledBatch | None, list[str]]:
        if not self.decode.running:
            return None, []
        retracted = self.decode.retract_until_fits()
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
        reqs = list(self.decode.running)
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
            if sample and len(req.output_ids) < req.sampling.min_new_tokens:
                banned = tuple(sorted(set(req.sampling.stop_token_ids) | (
                    set() if req.sampling.ignore_eos else set(self.eos_token_ids))))
            rows.append(SamplingRow(req.sampling, req.input_ids, req.output_ids, req.generator, banned))
        return rows

    # ---- processing the result ----------------------------------------------------------
    def _process_result(self, batch: ScheduledBatch, out: SampleOutput) -> None:
        for i, req in enumerate(batch.reqs):
            if not batch.sample_mask[i] or req.is_finished:
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
                if batch.mode is ForwardMode.DECODE:
                    self.decode.remove(req)
                self._finish(req, req.finish_reason)
            else:
                if batch.mode is ForwardMode.EXTEND:
                    self.decode.add([req])
                self._outbox.append(req)

    def _finish(self, req: Req, reason: FinishReason | None) -> None:
        req.finish(reason or FinishReason("abort"))
        self.cache.release(req)
        self._by_rid.pop(req.rid, None)
        self._outbox.append(req)

    def _on_idle(self) -> None:
        if not self.has_work:
            self.ratio.reset()
            if self.config.check_integrity_when_idle:
                self.check_integrity()
