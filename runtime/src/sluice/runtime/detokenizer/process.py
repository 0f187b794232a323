"""The Detokenizer process: token ids from the scheduler in, text deltas to the API server out.

It PULLs `BatchTokenIDOut` on `port_args.detokenizer_input`, keeps an
`IncrementalDetokenizer` per request (made on first sight, dropped when the request
finishes) and PUSHes one `BatchStrOut` per batch to `port_args.tokenizer_input`. Any other
message (`SchedulerStats`, `SchedulerReady`, ...) is passed through unchanged, in order.

When a stop string shows up in the text before the scheduler has finished the request (the
scheduler checks a short token window and can lag on characters split across tokens), the
request is reported finished here (without the tokens after the one that completed the
stop string), a `StopReq` tells the scheduler to finish it, and whatever the scheduler
still sends for it is dropped.
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
from sluice.runtime.ipc.messages import (
    BatchStrOut,
    BatchTokenIDOut,
    FinishReason,
    StopReq,
    TextUpdate,
)
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

    def handle(self, batch: BatchTokenIDOut) -> tuple[BatchStrOut, list[StopReq]]:
        """Detokenize one batch; returns the text out and the stops the scheduler must apply."""
        out = BatchStrOut([])
        stops: list[StopReq] = []
        for u in batch.updates:
            finish = u.finished
            if u.rid in self.stopped:
                if finish is not None:
                    del self.stopped[u.rid]
                continue
            state = self.states.get(u.rid)
            if state is None:
                params = u.detokenize
                state = IncrementalDetokenizer(
                    self.tokenizer,
                    params.skip_special_tokens if params else True,
                    params.stop if params else (),
                    spaces_between_special_tokens=(
                        params.spaces_between_special_tokens if params else True
                    ),
                    min_tokens=params.min_tokens if params else 0,
                )
                self.states[u.rid] = state
            scheduler_stop = finish.matched_str if finish is not None else None
            delta = state.add(u.new_token_ids, finish is not None, scheduler_stop)
            ids, logprobs, completion = u.new_token_ids, u.logprobs, u.completion_tokens
            if delta.matched_stop is not None and (finish is None or finish.kind != "stop"):
                # our own match: the request ends here, whatever the scheduler thinks
                if finish is None:
                    stops.append(StopReq(u.rid, delta.matched_stop))
                    self._remember_stopped(u.rid)
                finish = FinishReason("stop", matched_str=delta.matched_stop)
                kept = state.ids_before_stop if state.ids_before_stop is not None else len(ids)
                completion -= len(ids) - kept
                ids, logprobs = ids[:kept], logprobs[:kept]
            if finish is not None:
                self.states.pop(u.rid, None)
            kept_top = len(ids)
            out.updates.append(
                TextUpdate(
                    u.rid, delta.text, ids, logprobs, finish, u.prompt_tokens, completion,
                    u.cached_tokens, u.top_logprob_ids[:kept_top], u.top_logprob_values[:kept_top],
                    u.input_token_logprobs,
                )  # fmt: skip
            )
        return out, stops

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
            out, stops = manager.handle(msg)
            for stop in stops:
                logger.info(
                    "request stopped on a stop string before the scheduler saw it rid=%s",
                    stop.rid,
                )
                send(to_scheduler, stop)
            if out.updates:
                send(to_tokenizer, out)
    except Exception:
        logger.exception("detokenizer crashed")
        ctx.destroy(linger=0)
        sys.exit(1)
    logger.info("detokenizer exiting on signal")
    ctx.destroy(linger=0)
