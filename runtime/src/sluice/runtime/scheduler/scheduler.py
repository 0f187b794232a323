"""The scheduler: one tick = take requests in, choose a batch, run it, process the result.

It composes managers that never call back into it:

- `Intake` (intake.py): the requests by id, their checks on the way in, the single
  `finish`, and the outbox;
- `PrefillManager` (prefill.py): the waiting queue, the request being chunked, admission
  and its page allocation;
- `DecodeManager` (decode.py): the running set, the new-token ratio and retraction;
- `InFlight` (overlap.py): the launched batch and the releases it defers;
- `KVCacheManager` (cache.py): pages, rows and the prefix cache;
- `MaskHandOff` (grammar.py): when a constrained batch's vocab mask is filled.

Choosing a batch: with mixed chunks (the default) every tick decodes all running requests
and fills the rest of the chunk budget with prefill; without, prefill goes first, but a
running request waits at most `max_prefill_streak` prefill ticks for its next token.

Two loops share every decision: `step()` (normal) runs a batch and processes its result in
the same tick; `step_overlap()` launches batch N on the forward thread, then processes
batch N-1's result while N runs. A decode reads its input token from the worker's token
table, so the next batch can be launched before the host has seen the previous one's
tokens. Retraction needs the host's view of every request: an overlap tick that must
retract first waits for the in-flight batch.

A forward that raises loses its batch, not the server (`faults.py`): the batch's requests
end with an error, the in-flight forward is let finish, and the pool's books are checked
before the next tick; what cannot be survived raises `EngineDead`.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.runtime.disagg import KVTransfer
from sluice.runtime.engine.executor import Executor
from sluice.runtime.engine.forward_input import ForwardOutput
from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchTokenIDOut,
    FinishReason,
    KVReceived,
    KVSent,
    KVTransferFailed,
    LoadLoraReq,
    LoraOpResult,
    SchedulerStats,
    StopReq,
    TokenizedGenerateReq,
    UnloadLoraReq,
)
from sluice.runtime.scheduler.accounting import Counters, TickResult, TickTiming, stats_of
from sluice.runtime.scheduler.batch import ScheduledBatch, batch_of, forward_input
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import (
    DecodeManager,
    DecodeRows,
    NeedSync,
    NewTokenRatio,
    Retraction,
)
from sluice.runtime.scheduler.disagg import add_disagg_stats, disagg_roles
from sluice.runtime.scheduler.faults import EngineDead, fail_batch
from sluice.runtime.scheduler.grammar import GrammarQueue, MaskHandOff, accept
from sluice.runtime.scheduler.intake import Intake, IntakeRules
from sluice.runtime.scheduler.lora import AdapterGate
from sluice.runtime.scheduler.overlap import InFlight, Launched
from sluice.runtime.scheduler.policy import PolicyConfig
from sluice.runtime.scheduler.prefill import PrefillBatch, PrefillBudget, PrefillManager
from sluice.runtime.scheduler.request import Req
from sluice.runtime.scheduler.stop_strings import StopStringMatcher

logger = logging.getLogger("sluice.scheduler")

NEED_SYNC = NeedSync.NEED_SYNC


@dataclass(frozen=True)
class SchedulerConfig:
    max_running_requests: int
    max_prefill_tokens: int
    chunk_size: int
    context_len: int
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    retraction_policy: str = "length"
    init_new_token_ratio: float = 0.7
    random_seed: int = -1  # -1: unseeded requests draw fresh randomness
    mixed_chunk: bool = True
    max_prefill_streak: int = 4
    check_integrity_when_idle: bool = True
    vocab_size: int = 0  # the model's; token ids outside it are refused (0: not checked)
    max_loras: int = 0  # distinct LoRA adapters in one batch (0: no limit)


class Scheduler:
    intake: Intake  # built after the P/D roles, whose release callback reads it

    def __init__(
        self,
        config: SchedulerConfig,
        cache: KVCacheManager,
        executor: Executor,
        eos_token_ids: list[int],
        decode_text: Callable[[list[int], bool], str] | None = None,
        grammars: GrammarQueue | None = None,
        adapters: AdapterGate | None = None,
        disagg_mode: str = "null",
        transfer: KVTransfer | None = None,
    ) -> None:
        """`disagg_mode` "prefill" or "decode" (with its `transfer`): a P/D server."""
        self.config = config
        self.adapters = adapters or AdapterGate()
        self.cache = cache
        self.executor = executor
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stop_matcher = StopStringMatcher(decode_text) if decode_text else None
        self.prefill = PrefillManager(cache, config.chunk_size, config.policy)
        self.decode = DecodeManager(
            cache, NewTokenRatio(init=config.init_new_token_ratio), config.retraction_policy
        )
        self.inflight = InFlight()
        self.grammars = grammars
        self.masks = MaskHandOff(grammars)
        seeded = config.random_seed >= 0
        release = lambda r: self.intake.release(r)  # noqa: E731
        self.handoff, self.receiver = disagg_roles(disagg_mode, transfer, cache, release)
        self.intake = Intake(
            IntakeRules(config.context_len, config.vocab_size, self.eos_token_ids),
            random.Random(config.random_seed) if seeded else random.SystemRandom(),
            self.prefill, self.decode, grammars, self.inflight, cache, self.adapters,
            self.handoff, self.receiver,
        )  # fmt: skip
        self.timing = TickTiming()
        self.counters = Counters()
        self._prefill_streak = 0  # prefill-only ticks in a row while requests were decoding
        self._retracted: list[str] = []  # by this tick's schedule
        self._faulted = False  # a batch was lost this tick: verify before the next one

    @property
    def ratio(self) -> NewTokenRatio:
        return self.decode.ratio

    @property
    def has_work(self) -> bool:
        return (
            self.prefill.runnable
            or self.decode.runnable
            or self.inflight.launched is not None
            or bool(self.grammars)
            or (self.receiver is not None and self.receiver.head_fits(self.decode.reserved_tokens()))
        )

    def live_requests(self) -> list[Req]:
        """Requests holding (or about to hold) KV pages and rows."""
        return self.intake.live()

    def handle(self, msg: object) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self.intake.receive(msg)
        elif isinstance(msg, AbortReq):
            self.abort(msg.rid)
        elif isinstance(msg, (LoadLoraReq, UnloadLoraReq)):
            self.adapters.handle(msg, self.live_requests())
        elif isinstance(msg, StopReq):
            if (req := self.intake.get(msg.rid)) is not None:
                self.intake.finish(req, FinishReason("stop", matched_str=msg.matched_str))
        elif isinstance(msg, (KVSent, KVReceived, KVTransferFailed)):
            self._on_transfer(msg)
        else:
            logger.warning("scheduler ignored an unknown message %s", type(msg).__name__)

    def _on_transfer(self, msg: KVSent | KVReceived | KVTransferFailed) -> None:
        if self.handoff is not None:
            if isinstance(msg, KVSent):
                self.handoff.on_sent(msg)
            elif isinstance(msg, KVTransferFailed):
                logger.warning("KV transfer failed room=%d: %s", msg.room, msg.message)
                self.handoff.on_failed(msg)
        elif self.receiver is not None:
            if isinstance(msg, KVReceived):
                if (req := self.receiver.on_received(msg)) is not None:
                    self.decode.add([req])
                    self._after_token(req, req.output_ids[-1])
            elif isinstance(msg, KVTransferFailed) and (failed := self.receiver.on_failed(msg)):
                logger.warning("KV transfer failed room=%d: %s", msg.room, msg.message)
                self.intake.finish(*failed)

    def abort(self, rid: str) -> None:
        if (req := self.intake.get(rid)) is not None:
            self.intake.finish(req, FinishReason("abort", message="aborted by the client"))

    # ---- the two loops ------------------------------------------------------------------
    def step(self) -> TickResult | None:
        """Normal loop: choose a batch, run it and process its result. None when idle."""
        t0 = time.perf_counter()
        batch = self._schedule(allow_retract=True)
        t1 = time.perf_counter()
        if not isinstance(batch, ScheduledBatch):
            self.on_idle()
            self.timing.add(idle=t1 - t0)
            return None
        self._launch(batch)
        self.timing.add(schedule=t1 - t0, launch=time.perf_counter() - t1)
        self._complete(self.inflight.take())
        self._verify_after_fault()
        return self._tick_result(batch)

    def step_overlap(self) -> TickResult | None:
        """Overlap loop: launch the next batch, then process the previous one's result."""
        t0 = time.perf_counter()
        batch = self._schedule(allow_retract=self.inflight.launched is None)
        if batch is NEED_SYNC:
            self._complete(self.inflight.take())
            batch = self._schedule(allow_retract=True)
        t1 = time.perf_counter()
        previous = self.inflight.take()
        if isinstance(batch, ScheduledBatch):
            self._launch(batch, mask_now=previous is None)
        t2 = time.perf_counter()
        self._complete(previous)
        self.masks.fill_pending()
        self._verify_after_fault()
        if not isinstance(batch, ScheduledBatch):
            if previous is None:
                self.on_idle()
            self.timing.add(idle=t1 - t0)
            return None
        self.timing.add(schedule=t1 - t0, launch=t2 - t1)
        return self._tick_result(batch)

    # ---- choosing a batch ---------------------------------------------------------------
    def _schedule(self, allow_retract: bool) -> ScheduledBatch | NeedSync | None:
        self._retracted = []
        self.cache.slide_windows()
        if self.grammars:
            compiled, failed = self.grammars.ready()
            for req in compiled:
                self.intake.admit(req)
            for req, reason in failed:
                self.intake.finish(req, reason)
        if self.receiver is not None:
            self.receiver.reserve(self.decode.reserved_tokens())
        if self.config.policy.name == "priority" and (head := self.prefill.head()) is not None:
            fits = lambda: self.prefill.fits(head, self.decode.reserved_tokens())  # noqa: E731
            if self.decode.outranked_by(head, fits):
                if not allow_retract:
                    return NEED_SYNC
                self._record_retraction(self.decode.preempt_for(head, fits), why="preempted by priority")
        decoding = self.decode.runnable
        mixed = self.config.mixed_chunk
        prefill: PrefillBatch | None = None
        if not mixed and not (decoding and self._prefill_streak >= self.config.max_prefill_streak):
            prefill = self._schedule_prefill(self.config.max_prefill_tokens)
            if prefill is not None or not decoding:
                self._prefill_streak = self._prefill_streak + 1 if decoding and prefill else 0
                return batch_of(None, prefill, self.cache)
        decode = self.decode.schedule(self.inflight.tokens_in_flight, allow_retract) if decoding else None
        if decode is NEED_SYNC:
            return NEED_SYNC
        assert not isinstance(decode, NeedSync)
        if decode is not None:
            self._after_decode_schedule(decode)
        if mixed and (decode is None or decode.retraction is None):
            rows = len(decode.reqs) if decode is not None else 0
            budget = self.config.chunk_size - rows if rows else self.config.max_prefill_tokens
            prefill = self._schedule_prefill(budget)
        self._prefill_streak = 0
        return batch_of(decode, prefill, self.cache)

    def _schedule_prefill(self, token_budget: int) -> PrefillBatch | None:
        budget = PrefillBudget(
            token_budget, self.decode.reserved_tokens(), self.config.max_loras,
            frozenset(r.sampling.lora_id for r in self.decode.running.values()),
        )  # fmt: skip
        batch = self.prefill.schedule(budget)
        if batch is None:
            if self.prefill.chunked is not None and not self.decode.runnable and not self.inflight.launched:
                stuck = self.prefill.abort_stuck_chunk()
                assert stuck is not None
                self.intake.finish(stuck, FinishReason("abort", message="KV pool exhausted"))
            return None
        self.counters.prefilled(batch, time.time())
        # prompts completing here decode next; their first token is sampled by this batch
        # (a prefill-only request, max_new_tokens 0, is done once its prompt is computed)
        self.decode.add([r for r, done in zip(batch.reqs, batch.complete, strict=True)
                         if done and r.sampling.max_new_tokens > 0])  # fmt: skip
        return batch

    def _after_decode_schedule(self, decode: DecodeRows) -> None:
        for req in decode.given_up:
            self.intake.finish(req, FinishReason("abort", message="the KV pool cannot hold this request"))
            logger.warning("request aborted rid=%s reason=kv-pool-too-small", req.rid)
        if decode.retraction is not None:
            self._record_retraction(decode.retraction, why="KV pool exhausted")

    def _record_retraction(self, r: Retraction, why: str) -> None:
        if not r.reqs:
            return
        self._retracted += [q.rid for q in r.reqs]
        self.counters.retractions_total += len(r.reqs)
        self.counters.retracted_tokens_total += r.freed_tokens
        self.prefill.requeue_front(r.reqs)
        logger.info(
            "retracted requests=%d tokens=%d running=%d new_token_ratio=%.3f->%.3f reason=%s",
            len(r.reqs), r.freed_tokens, len(self.decode.running), r.ratio_before, r.ratio_after,
            why,
        )

    # ---- running and processing ---------------------------------------------------------
    def _launch(self, batch: ScheduledBatch, mask_now: bool = True) -> None:
        """Submit `batch`. A constrained row's mask needs every earlier token accepted: with
        `mask_now` False (overlap, the previous batch unprocessed) it is filled by
        `masks.fill_pending` after the previous result, while the forward runs."""
        sampled = [r for r, s in zip(batch.reqs, batch.sample, strict=True) if s]
        mask = self.masks.mask_for(sampled, fill_now=mask_now)
        fi = forward_input(batch, self.cache, self.eos_token_ids, self.inflight.tokens_in_flight, mask)
        result = self.executor.submit(fi)
        self.inflight.launch(batch, result)

    def _complete(self, launched: Launched | None) -> None:
        if launched is None:
            return
        t0 = time.perf_counter()
        try:
            out = launched.result.result()
        except Exception as exc:
            self._fail_batch(launched.batch, exc)
            return
        t1 = time.perf_counter()
        self._process_result(launched.batch, out)
        self.timing.add(wait=t1 - t0, forward=out.forward_seconds, process=time.perf_counter() - t1)
        self.inflight.release_unused(self.cache)

    def _fail_batch(self, batch: ScheduledBatch, exc: Exception) -> None:
        self.counters.failed_batches += 1
        try:
            fail_batch(batch, exc, self.cache, self.intake.finish)
        finally:
            self.inflight.release_unused(self.cache)
        self._faulted = True

    def _verify_after_fault(self) -> None:
        """After a lost batch: let the in-flight forward finish (it may fail too), then
        check the pool's books; if they do not balance the engine is unusable."""
        if not self._faulted:
            return
        while self._faulted:
            self._faulted = False
            self._complete(self.inflight.take())
        try:
            self.check_integrity()
        except AssertionError as err:
            raise EngineDead(f"KV pool integrity check failed after a fault: {err}") from err
        logger.info("pool integrity verified after the fault; serving on")

    def _process_result(self, batch: ScheduledBatch, out: ForwardOutput) -> None:
        tops = out.top_logprobs or [None] * len(out.token_ids)
        sampled = iter(zip(out.token_ids, out.logprobs, tops, strict=True))
        for i, req in enumerate(batch.reqs):
            if i >= batch.num_decode and not req.is_finished:
                # a computed prompt (or chunk) is shareable at once, not only when it finishes
                self.cache.cache_unfinished(req, batch.starts[i] + batch.lens[i])
                if out.prompt_logprobs:
                    req.input_logprobs.extend(out.prompt_logprobs[i])
            if not batch.sample[i]:  # an intermediate chunk samples no token
                if req.sampling.max_new_tokens == 0 and batch.starts[i] + batch.lens[i] == req.seq_len:
                    self.intake.finish(req, FinishReason("length"))  # prefill only: the prompt is in
                continue
            token, logprob, top = next(sampled)
            if req.is_finished:  # finished or aborted while this forward ran: drop the token
                continue
            req.output_ids.append(token)
            if req.sampling.logprobs:
                req.output_logprobs.append(logprob if logprob is not None else 0.0)
            if top is not None:
                req.output_top_logprobs.append(top)
            self.counters.generated_tokens += 1
            self._after_token(req, token)

    def _after_token(self, req: Req, token: int) -> None:
        """`token` was just appended to `req`'s output: its grammar takes it, the stop
        conditions are checked, and it is finished or reported."""
        if (grammar_end := accept(req, token)) is not None:
            req.finish(grammar_end)
        req.check_finished_after(token)
        if not req.is_finished and self.stop_matcher and req.sampling.stop:
            self.stop_matcher.check(req)
        if req.is_finished:
            self.intake.finish(req, req.finish_reason)
        else:
            self.intake.report(req)

    # ---- reporting ----------------------------------------------------------------------
    def _tick_result(self, batch: ScheduledBatch) -> TickResult:
        rids = [r.rid for r in batch.reqs]
        return TickResult(batch.mode, rids, batch.num_tokens, self._retracted, batch.num_decode)

    def take_output(self) -> BatchTokenIDOut | None:
        """Tokens generated (and requests finished) since the last call, for the detokenizer."""
        return self.intake.take_output()

    def stats(self) -> SchedulerStats:
        """Everything the scheduler publishes."""
        stats = self.load_stats()
        stats.queue_prompt_tokens = self.queue_prompt_tokens()
        return stats

    def load_stats(self) -> SchedulerStats:
        """`stats()` but `queue_prompt_tokens`, the one field that costs O(waiting): what the
        loop reads every tick to decide whether to publish."""
        running = self.decode.running_with_chunk(self.prefill.chunked)
        adapters = self.adapters.stats(running, self.prefill.waiting)
        waiting = len(self.prefill.waiting) + (len(self.receiver.waiting) if self.receiver else 0)
        stats = stats_of(self.counters, self.cache, waiting, running, self.ratio.value, adapters)
        add_disagg_stats(stats, self.handoff, self.receiver)
        return stats

    def queue_prompt_tokens(self) -> int:
        """Prompt positions the waiting requests still need computed."""
        return sum(self.cache.extend_len(r) for r in self.prefill.waiting)

    def take_transfer_seconds(self) -> list[float]:
        """Seconds each KV transfer received since the last call took (decode server)."""
        return self.receiver.take_transfer_seconds() if self.receiver is not None else []

    def take_replies(self) -> list[LoraOpResult]:
        """Answers to LoRA loads and unloads since the last call."""
        return self.adapters.take_replies()

    def take_queue_times(self) -> list[float]:
        """Seconds each request admitted since the last call waited (arrival to its first
        admission into a batch; re-admissions after a retraction are not counted)."""
        return self.counters.take_queue_times()

    def check_integrity(self) -> None:
        self.executor.wait_idle()  # the device tables are compared too
        self.cache.check_integrity(self.live_requests(), self.executor.device_row)
        self.counters.integrity_checks += 1

    def fail_all(self, reason: FinishReason) -> None:
        self.intake.fail_all(reason)

    def on_idle(self) -> None:
        """With nothing left to run: reset new_token_ratio and check the books."""
        if not self.has_work and not self.inflight.deferred:
            self.ratio.reset()
            if self.config.check_integrity_when_idle:
                self.check_integrity()
