"""The Detokenizer's batch handling and its process loop over real ZeroMQ sockets."""

import signal
import subprocess
import sys

import pytest
import zmq

from sluice.runtime.detokenizer.process import DetokenizerManager, run_detokenizer_process
from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    BatchTokenIDOut,
    FinishReason,
    SchedulerStats,
)
from sluice.runtime.ipc.sockets import PortArgs, pull_socket, push_socket, recv, send


def batch(rows):
    """rows: (rid, ids, finished, stop_strings)"""
    return BatchTokenIDOut(
        rids=[r[0] for r in rows],
        new_token_ids=[r[1] for r in rows],
        finished=[r[2] for r in rows],
        prompt_tokens=[5] * len(rows),
        completion_tokens=[len(r[1]) for r in rows],
        cached_tokens=[0] * len(rows),
        logprobs=[[] for _ in rows],
        skip_special_tokens=[True] * len(rows),
        stop_strings=[r[3] for r in rows],
    )


def enc(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_each_request_gets_its_own_text(tokenizer):
    m = DetokenizerManager(tokenizer)
    a, b = enc(tokenizer, "alpha beta"), enc(tokenizer, "gamma delta")
    out, aborts = m.handle(batch([("a", a, None, []), ("b", b[:1], None, [])]))
    out2, _ = m.handle(batch([("b", b[1:], FinishReason("length"), [])]))
    assert out.rids == ["a", "b"] and out.text_deltas[0] == "alpha beta"
    assert out.text_deltas[1] + out2.text_deltas[0] == "gamma delta"
    assert out2.finished == [FinishReason("length")]
    assert aborts == [] and "b" not in m.states


def test_finished_requests_are_forgotten(tokenizer):
    m = DetokenizerManager(tokenizer)
    m.handle(batch([("a", enc(tokenizer, "x"), FinishReason("stop", matched_token=2), [])]))
    assert m.states == {}


def test_a_stop_string_seen_first_here_finishes_and_aborts_the_request(tokenizer):
    m = DetokenizerManager(tokenizer)
    out, aborts = m.handle(batch([("a", enc(tokenizer, "Hello, world! more"), None, ["!"])]))
    assert out.text_deltas == ["Hello, world"]
    assert out.finished == [FinishReason("stop", matched_str="!")]
    assert aborts == ["a"]
    # the scheduler's updates for the stopped request are dropped, then it is forgotten
    late, _ = m.handle(batch([("a", enc(tokenizer, " x"), FinishReason("abort"), ["!"])]))
    assert late.rids == [] and m.stopped == {} and m.states == {}


def test_a_stop_string_the_scheduler_also_saw_needs_no_abort(tokenizer):
    m = DetokenizerManager(tokenizer)
    finish = FinishReason("stop", matched_str="!")
    out, aborts = m.handle(batch([("a", enc(tokenizer, "Hi! x"), finish, ["!"])]))
    assert out.text_deltas == ["Hi"] and out.finished == [finish] and aborts == []


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
        assert isinstance(out, BatchStrOut) and out.text_deltas == ["Paris"]
        assert recv(to_scheduler, timeout_ms=10_000) == AbortReq("r")
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
