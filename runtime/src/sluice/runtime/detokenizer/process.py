"""The Detokenizer process: token ids from the scheduler in, text deltas to the API server out.

It PULLs `BatchTokenIDOut` on `port_args.detokenizer_input`, keeps an
`IncrementalDetokenizer` per request (made on first sight, dropped when the request
finishes) and PUSHes one `BatchStrOut` per batch to `port_args.tokenizer_input`. Any other
message (`SchedulerStats`, `SchedulerReady`, ...) is passed through unchanged, in order.

When a stop string shows up in the text before the scheduler has finished the request (the
scheduler checks a short token window and can lag on characters split across tokens), the
request is reported finished here, an `AbortReq` tells the scheduler to free it, and
whatever the scheduler still sends for it is dropped.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import zmq

from sluice.runtime.detokenizer.incremental import IncrementalDetokenizer
from sluice.runtime.ipc.messages import AbortReq, BatchStrOut, BatchTokenIDOut, FinishReason
from sluice.runtime.ipc.sockets import PortArgs, pull_socket, push_socket, recv, send
from sluice.runtime.threads import limit_helper_process_threads

logger = logging.getLogger("sluice.detokenizer")

POLL_MS = 100  # how often the loop looks at the SIGTERM flag while idle
MAX_STOPPED_REMEMBERED = 4096  # requests finished here whose scheduler finish is pending
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


@dataclass
class DetokenizerManager:
    """The per-request state and the batch transformation, with no sockets: testable alone."""

    tokenizer: Any
    states: dict[str, IncrementalDetokenizer] = field(default_factory=dict)
    # rids finished here on a stop string; the scheduler's later updates for them are dropped
    stopped: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def handle(self, batch: BatchTokenIDOut) -> tuple[BatchStrOut, list[str]]:
        """Detokenize one batch; returns the text out and the rids the scheduler must abort."""
        out = BatchStrOut([], [], [], [], [], [], [], [])
        to_abort: list[str] = []
        for i, rid in enumerate(batch.rids):
            finish = batch.finished[i]
            if rid in self.stopped:
                if finish is not None:
                    del self.stopped[rid]
                continue
            state = self.states.get(rid)
            if state is None:
                state = IncrementalDetokenizer(
                    self.tokenizer, batch.skip_special_tokens[i], batch.stop_strings[i]
                )
                self.states[rid] = state
            scheduler_stop = finish.matched_str if finish is not None else None
            delta = state.add(batch.new_token_ids[i], finish is not None, scheduler_stop)
            if delta.matched_stop is not None and (finish is None or finish.kind != "stop"):
                # our own match: the request ends here, whatever the scheduler thinks
                if finish is None:
                    to_abort.append(rid)
                    self._remember_stopped(rid)
                finish = FinishReason("stop", matched_str=delta.matched_stop)
            if finish is not None:
                self.states.pop(rid, None)
            out.rids.append(rid)
            out.text_deltas.append(delta.text)
            out.new_token_ids.append(batch.new_token_ids[i])
            out.finished.append(finish)
            out.prompt_tokens.append(batch.prompt_tokens[i])
            out.completion_tokens.append(batch.completion_tokens[i])
            out.cached_tokens.append(batch.cached_tokens[i])
            out.logprobs.append(batch.logprobs[i])
        return out, to_abort

    def _remember_stopped(self, rid: str) -> None:
        self.stopped[rid] = None
        while len(self.stopped) > MAX_STOPPED_REMEMBERED:
            self.stopped.popitem(last=False)


def run_detokenizer_process(
    tokenizer_path: str, port_args: PortArgs, log_level: str = "info"
) -> None:
    """Entry point of the Detokenizer child process. Exits 0 on SIGTERM, 1 on a crash.

    SIGINT is ignored: on Ctrl-C the parent drains first and then stops its children.
    """
    logging.basicConfig(level=log_level.upper(), format=LOG_FORMAT)
    stop_requested = False

    def _on_sigterm(signum: int, frame: Any) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ctx = zmq.Context()
    try:
        from transformers import AutoTokenizer

        limit_helper_process_threads()
        manager = DetokenizerManager(AutoTokenizer.from_pretrained(tokenizer_path))
        from_scheduler = pull_socket(ctx, port_args.detokenizer_input)
        to_tokenizer = push_socket(ctx, port_args.tokenizer_input)
        to_scheduler = push_socket(ctx, port_args.scheduler_input)
        logger.info("detokenizer ready tokenizer=%s", tokenizer_path)
        while not stop_requested:
            msg = recv(from_scheduler, timeout_ms=POLL_MS)
            if msg is None:
                continue
            if not isinstance(msg, BatchTokenIDOut):
                send(to_tokenizer, msg)
                continue
            out, to_abort = manager.handle(msg)
            for rid in to_abort:
                logger.info(
                    "request stopped on a stop string before the scheduler saw it rid=%s", rid
                )
                send(to_scheduler, AbortReq(rid))
            if out.rids:
                send(to_tokenizer, out)
    except Exception:
        logger.exception("detokenizer crashed")
        ctx.destroy(linger=0)
        sys.exit(1)
    logger.info("detokenizer exiting on signal")
    ctx.destroy(linger=0)
