"""`Intake`: the requests the scheduler holds, by id; what comes in, and the one way out.

A request comes in checked (room in the context, token ids inside the vocabulary, a known
adapter, no id twice) and goes to its grammar's compile queue or straight to prefill; one
that fails a check is answered at once. Whatever ends a request, `finish` takes it from the
manager that holds it and gives its row and pages back exactly once (after the in-flight
forward, when that forward still uses them). Every request with something to report waits
in the outbox until the loop takes the output.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass

import torch

from sluice.runtime.ipc.messages import BatchTokenIDOut, FinishReason, TokenizedGenerateReq
from sluice.runtime.scheduler.accounting import token_output
from sluice.runtime.scheduler.cache import KVCacheManager
from sluice.runtime.scheduler.decode import DecodeManager
from sluice.runtime.scheduler.disagg import DecodeReceiver, PrefillHandoff
from sluice.runtime.scheduler.grammar import GrammarQueue
from sluice.runtime.scheduler.lora import AdapterGate
from sluice.runtime.scheduler.overlap import InFlight
from sluice.runtime.scheduler.prefill import PrefillManager
from sluice.runtime.scheduler.request import Req

logger = logging.getLogger("sluice.scheduler")


@dataclass(frozen=True)
class IntakeRules:
    context_len: int
    vocab_size: int  # token ids outside it are refused (0: not checked)
    eos_token_ids: frozenset[int]


def out_of_vocab(ids: list[int], vocab_size: int) -> int | None:
    """The first id outside [0, vocab_size), if any (vocab_size 0: not checked)."""
    if vocab_size <= 0:
        return None
    return next((t for t in ids if not 0 <= t < vocab_size), None)


class Intake:
    def __init__(
        self,
        rules: IntakeRules,
        rng: random.Random,
        prefill: PrefillManager,
        decode: DecodeManager,
        grammars: GrammarQueue | None,
        inflight: InFlight,
        cache: KVCacheManager,
        adapters: AdapterGate,
        handoff: PrefillHandoff | None = None,
        receiver: DecodeReceiver | None = None,
    ) -> None:
        """`handoff` on a prefill server, `receiver` on a decode server (P/D)."""
        self.rules = rules
        self._rng = rng
        self._prefill, self._decode, self._grammars = prefill, decode, grammars
        self._inflight, self._cache, self._adapters = inflight, cache, adapters
        self._handoff, self._receiver = handoff, receiver
        self.requests: dict[str, Req] = {}
        self.outbox: list[Req] = []

    def receive(self, msg: TokenizedGenerateReq) -> None:
        """Take `msg` in; one request that cannot be added fails alone."""
        known = self.requests.get(msg.rid)
        try:
            self.add(msg)
        except Exception as exc:
            logger.exception("request rejected rid=%s", msg.rid)
            reason = FinishReason("error", message=f"cannot schedule the request: {exc!r}")
            req = self.requests.get(msg.rid)
            if req is not None and req is not known:
                self.finish(req, reason)
                return
            refused = Req(msg.rid, list(msg.input_ids), msg.sampling, handoff=msg.handoff)
            refused.finish(reason)
            self._refuse(refused)

    def add(self, msg: TokenizedGenerateReq) -> None:
        sp = msg.sampling
        room = self.rules.context_len - len(msg.input_ids)
        if sp.max_new_tokens > room > 0:  # the request's own copy: the message stays as sent
            sp = dataclasses.replace(sp, max_new_tokens=room)
        if msg.handoff is not None and self._handoff is not None:  # the decode server goes on
            sp = dataclasses.replace(sp, max_new_tokens=min(sp.max_new_tokens, 1))
        seed = sp.seed if sp.seed is not None else self._rng.getrandbits(63)
        req = Req(
            rid=msg.rid,
            input_ids=list(msg.input_ids),
            sampling=sp,
            arrival_time=msg.arrival_time or time.time(),
            eos_token_ids=self.rules.eos_token_ids,
            generator=torch.Generator().manual_seed(seed),
            handoff=msg.handoff,
        )
        problem = self._problem(req, room)
        if problem:
            req.finish(FinishReason("abort", message=problem))
            logger.info("request rejected rid=%s reason=%s", req.rid, problem)
            self._refuse(req)
            return
        self.requests[req.rid] = req
        if sp.constraint is None:
            self.admit(req)
        elif self._grammars is None:
            self.finish(req, FinishReason("abort", message="constrained decoding is off"))
        else:
            self._grammars.add(req)  # admitted once its grammar has compiled

    def _problem(self, req: Req, room: int) -> str:
        vocab = self.rules.vocab_size
        if req.rid in self.requests or self._cache.holds_id(req.rid):  # the latter: finishing
            return f"duplicate request id {req.rid}"
        if not req.input_ids or room < 1:
            return (
                f"prompt of {len(req.input_ids)} tokens does not fit the context length "
                f"{self.rules.context_len}"
            )
        if (bad := out_of_vocab(req.input_ids + req.sampling.stop_token_ids, vocab)) is not None:
            return f"token id {bad} is outside the model's vocabulary [0, {vocab})"
        if req.sampling.lora_id:
            return self._adapters.unknown(req.sampling.lora_id)
        return ""

    def _refuse(self, req: Req) -> None:
        """Answer a request that never entered (a P/D request's other side is told)."""
        if self._handoff is not None:
            self._handoff.keep(req)
        if self._receiver is not None:
            self._receiver.refuse(req)
        self.outbox.append(req)

    def admit(self, req: Req) -> None:
        """A request ready to be scheduled: to the prefill queue, or on a decode server a
        P/D request to wait for its pages and KV."""
        if req.handoff is not None and self._receiver is not None:
            self._receiver.add(req)
        else:
            self._prefill.add(req)

    def get(self, rid: str) -> Req | None:
        return self.requests.get(rid)

    def live(self) -> list[Req]:
        """Requests holding (or about to hold) KV pages and rows."""
        sending = self._handoff.live() if self._handoff is not None else []
        return list(self.requests.values()) + self._inflight.deferred + sending

    def report(self, req: Req) -> None:
        """`req` has new tokens for the detokenizer."""
        self.outbox.append(req)

    def finish(self, req: Req, reason: FinishReason | None) -> None:
        """End a request wherever it is; its row and pages go back exactly once (after the
        in-flight batch, if that batch still uses them)."""
        req.finish(reason or FinishReason("abort"))
        holders = (self._prefill, self._decode, self._receiver, self._grammars)
        any(h.remove(req) for h in holders if h is not None)  # the one that holds it
        self.requests.pop(req.rid, None)
        self.outbox.append(req)
        if self._handoff is None or not self._handoff.keep(req):
            self.release(req)

    def release(self, req: Req) -> None:
        """Give an ended request's row and pages back (after the in-flight batch, if that
        batch still uses them)."""
        self._inflight.release_or_defer(req, self._cache)

    def fail_all(self, reason: FinishReason) -> None:
        """The engine is going down: end every request (nothing will run again, so their
        pages are not given back)."""
        for req in self.requests.values():
            req.finish(reason)
            self.outbox.append(req)
        self.requests.clear()

    def take_output(self) -> BatchTokenIDOut | None:
        """Tokens generated (and requests finished) since the last call, for the detokenizer."""
        if not self.outbox:
            return None
        reqs, self.outbox = self.outbox, []
        return token_output(reqs)
