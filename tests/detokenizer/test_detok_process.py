"""The Detokenizer's batch handling and its process loop over real ZeroMQ sockets."""

import signal
import subprocess
import sys

import pytest
import zmq

from sluice.runtime.detokenizer.process import DetokenizerManager, run_detokenizer_process
from sluice.runtime.ipc.messages import (
    BatchStrOut,
    BatchTokenIDOut,
    DetokenizeParams,
    FinishReason,
    SchedulerStats,
    StopReq,
    TokenUpdate,
)
from sluice.runtime.ipc.sockets import PortArgs, pull_socket, push_socket, recv, send


def batch(rows):
    """rows: (rid, ids, finished, stop_strings)"""
    return BatchTokenIDOut(
        [
            TokenUpdate(rid, ids, [], finished, 5, len(ids), 0, DetokenizeParams(True, stops))
            for rid, ids, finished, stops in rows
        ]
    )


def texts(out):
    return [u.text for u in out.updates]


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_each_request_gets_its_own_text(tokenizer):
    m = DetokenizerManager(tokenizer)
    a, b = enc(tokenizer, "alpha beta"), enc(tokenizer, "gamma delta")
    out, aborts = m.handle(batch([("a", a, None, []), ("b", b[:1], None, [])]))
    out2, _ = m.handle(batch([("b", b[1:], FinishReason("length"), [])]))
    assert [u.rid for u in out.updates] == ["a", "b"] and texts(out)[0] == "alpha beta"
    assert texts(out)[1] + texts(out2)[0] == "gamma delta"
    assert [u.finished for u in out2.updates] == [FinishReason("length")]
    assert aborts == [] and "b" not in m.states


def test_finished_requests_are_forgotten(tokenizer):
    m = DetokenizerManager(tokenizer)
    m.handle(batch([("a", enc(tokenizer, "x"), FinishReason("stop", matched_token=2), [])]))
    assert m.states == {}


def test_a_stop_string_seen_first_here_finishes_and_stops_the_request(tokenizer):
    m = DetokenizerManager(tokenizer)
    ids = enc(tokenizer, "Hello, world! more")
    out, stops = m.handle(batch([("a", ids, None, ["!"])]))
    (u,) = out.updates
    assert u.text == "Hello, world"
    assert u.finished == FinishReason("stop", matched_str="!")
    assert stops == [StopReq("a", "!")]
    # the tokens after the one that completed "!" are not part of the output
    assert tokenizer.decode(u.new_token_ids).endswith("!") and u.new_token_ids == ids[: len(u.new_token_ids)]
    assert u.completion_tokens == len(u.new_token_ids) < len(ids)
    # the scheduler's updates for the stopped request are dropped, then it is forgotten
    late, _ = m.handle(batch([("a", enc(tokenizer, " x"), FinishReason("stop", matched_str="!"), ["!"])]))
    assert late.updates == [] and m.stopped == {} and m.states == {}


def test_a_stop_string_the_scheduler_also_saw_needs_no_abort(tokenizer):
    m = DetokenizerManager(tokenizer)
    finish = FinishReason("stop", matched_str="!")
    out, stops = m.handle(batch([("a", enc(tokenizer, "Hi! x"), finish, ["!"])]))
    assert texts(out) == ["Hi"] and [u.finished for u in out.updates] == [finish] and stops == []


def test_the_process_detokenizes_passes_stats_through_and_exits_on_sigterm(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path)
    ports = PortArgs.fresh()
    ctx = zmq.Context()
    to_tokenizer = pull_socket(ctx, ports.tokenizer_input)
    to_scheduler = pull_socket(ctx, ports.scheduler_input)
    to_detok = push_socket(ctx, ports.detokenizer_input)
    code = (
        "from sluice.runtime.detokenizer.process import run_detokenizer_process\n"
        "from sluice.runtime.ipc.sockets import PortArgs\n"
        f"run_detokenizer_process({str(tmp_path)!r}, PortArgs(*{tuple(vars(ports).values())!r}))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        send(to_detok, SchedulerStats(queue_requests=3))
        send(to_detok, batch([("r", enc(tokenizer, "Paris. x"), None, ["."])]))
        stats = recv(to_tokenizer, timeout_ms=60_000)
        out = recv(to_tokenizer, timeout_ms=10_000)
        assert stats == SchedulerStats(queue_requests=3)
        assert isinstance(out, BatchStrOut) and texts(out) == ["Paris"]
        assert recv(to_scheduler, timeout_ms=10_000) == StopReq("r", ".")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        ctx.destroy(linger=0)


def test_the_process_exits_non_zero_when_it_cannot_start(tmp_path):
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pytest.raises(SystemExit) as info:
            run_detokenizer_process(str(tmp_path), PortArgs.fresh())  # no tokenizer there
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert info.value.code == 1
