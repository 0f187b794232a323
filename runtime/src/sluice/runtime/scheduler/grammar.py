"""Constrained requests before and during decoding: their grammars and the vocab mask.

A request with a constraint waits here (not in the waiting queue) while its grammar
compiles on the compiler's threads; `ready()` hands the compiled ones, in arrival order,
to admission with a fresh matcher. While it runs, its matcher holds exactly the tokens the
host has processed (`accept`), so a retracted request resumes in the same grammar state
and a token dropped in flight is never accepted.

The mask of a batch is filled from the matchers when the previous batch's tokens have been
accepted: at launch in the normal loop, after the previous result in the overlap loop (the
forward thread waits for it before sampling, see `VocabMask`).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from sluice.runtime.constrained import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    GrammarMatcher,
    allocate_token_bitmask,
)
from sluice.runtime.engine.forward_input import VocabMask
from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.scheduler.request import Req


@dataclass
class GrammarQueue:
    compiler: GrammarCompiler
    pending: dict[int, tuple[Req, Future[CompiledGrammar]]] = field(default_factory=dict)

    def add(self, req: Req) -> None:
        assert req.sampling.constraint is not None
        self.pending[id(req)] = (req, self.compiler.compile_async(req.sampling.constraint))

    def remove(self, req: Req) -> bool:
        return self.pending.pop(id(req), None) is not None

    def __bool__(self) -> bool:
        return bool(self.pending)

    def ready(self) -> tuple[list[Req], list[tuple[Req, FinishReason]]]:
        """Requests whose grammar compiled (matcher attached), and those whose failed."""
        return self.take({req.rid for req, future in self.pending.values() if future.done()})

    def take(self, rids: set[str]) -> tuple[list[Req], list[tuple[Req, FinishReason]]]:
        """`ready()` for the requests `rids` (their compilations waited for if need be)."""
        done, failed = [], []
        for key, (req, future) in list(self.pending.items()):
            if req.rid not in rids:
                continue
            del self.pending[key]
            try:
                req.matcher = GrammarMatcher(future.result())
                done.append(req)
            except GrammarError as err:
                failed.append((req, FinishReason("abort", message=str(err))))
            except Exception as err:  # the compiler itself failed: this request alone
                reason = FinishReason("error", message=f"grammar compilation failed: {err!r}")
                failed.append((req, reason))
        return done, failed

    def mask_for(self, reqs: Sequence[Req]) -> torch.Tensor | None:
        """The bitmask of the sampled rows `reqs` (None when none is constrained): a running
        matcher's allowed tokens; all allowed for a finished request (its token is dropped)."""
        rows = [i for i, r in enumerate(reqs) if r.matcher is not None and not r.is_finished]
        if not rows:
            return None
        bitmask = allocate_token_bitmask(len(reqs), self.compiler.vocab_size)
        for i in rows:
            reqs[i].matcher.fill_next_token_bitmask(bitmask, i)  # type: ignore[union-attr]
        return bitmask


def accept(req: Req, token: int) -> FinishReason | None:
    """Advance `req`'s matcher by its new token; the finish this implies, if any."""
    if req.matcher is None:
        return None
    if not req.matcher.accept_token(token):
        return FinishReason("abort", message=f"token {token} does not match the constraint")
    if req.matcher.is_terminated():
        return FinishReason("stop", matched_token=token)
    return None


@dataclass(frozen=True)
class PendingMask:
    """A launched batch's mask and the sampled requests it is filled from."""

    mask: VocabMask
    reqs: list[Req]

    def fill(self, queue: GrammarQueue) -> None:
        try:
            self.mask.result.set_result(queue.mask_for(self.reqs))
        except Exception as err:  # the forward thread sees it when it samples
            self.mask.result.set_exception(err)


def pending_mask(queue: GrammarQueue | None, sampled: Sequence[Req]) -> PendingMask | None:
    """The mask a launch needs, not filled yet (None when no sampled row is constrained)."""
    if queue is None or not any(r.matcher is not None for r in sampled):
        return None
    return PendingMask(VocabMask(), list(sampled))


class MaskHandOff:
    """A constrained row's vocab mask needs every earlier token of its request accepted.
    With the previous batch processed it is filled at launch; in the overlap loop, where
    the previous result is still to be processed, it is filled right after that result
    (`fill_pending`), while the forward runs and waits for it before sampling."""

    def __init__(self, grammars: GrammarQueue | None) -> None:
        self.grammars = grammars
        self._pending: PendingMask | None = None

    def mask_for(self, sampled: Sequence[Req], fill_now: bool) -> VocabMask | None:
        """The mask a launch of `sampled` rows needs (None when none is constrained)."""
        pending = pending_mask(self.grammars, sampled)
        self._pending = None if fill_now else pending
        if pending is not None and fill_now:
            pending.fill(self.grammars)  # type: ignore[arg-type]  # pending: grammars is set
        return pending.mask if pending is not None else None

    def fill_pending(self) -> None:
        if self._pending is not None and self.grammars is not None:
            pending, self._pending = self._pending, None
            pending.fill(self.grammars)
