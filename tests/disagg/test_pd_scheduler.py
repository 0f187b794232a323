"""A prefill and a decode scheduler joined by the real TCP transfer, driven tick by tick in
one process: greedy outputs equal one scheduler's (fp32, both loops), the decode side
computes no prompt position, and every way a P/D request can end gives its pages back on
both sides."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from scheduler.conftest import Harness
from server_process import free_port

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import DisaggHandoff, SamplingParams, TokenizedGenerateReq
from sluice.runtime.ipc.sockets import pull_socket, recv, recv_all_nowait
from sluice.runtime.scheduler.process import build_scheduler, kv_transfer
from sluice.runtime.server_args import ServerArgs

DEADLINE_S = 120.0
BASE = {
    "device": "cpu", "dtype": "float32", "max_total_tokens": 4096, "max_running_requests": 8,
    "disable_overlap_schedule": True, "page_size": 4, "chunked_prefill_size": 64,
}  # fmt: skip


class Side(Harness):
    inbox: zmq.Socket | None = None

    def pump(self, wait_ms: int = 0) -> None:
        """Hand the transfer's events to the scheduler (waiting up to `wait_ms` for one)."""
        assert self.inbox is not None
        first = recv(self.inbox, wait_ms) if wait_ms else None
        for msg in ([first] if first is not None else []) + recv_all_nowait(self.inbox):
            self.scheduler.handle(msg)


@pytest.fixture
def make_side(tiny_llama_path: Path) -> Iterator:
    ctx = zmq.Context()
    made: list[Side] = []

    def factory(mode: str, **overrides: object) -> Side:
        args = dataclasses.replace(ServerArgs(model=str(tiny_llama_path)), **{
            **BASE, "disaggregation_mode": mode, "disaggregation_bootstrap_port": free_port(),
            **overrides})  # fmt: skip
        worker = ModelWorker(args, tiny_llama_path)
        address = f"ipc://{tempfile.mkdtemp(prefix='sluice-test-')}/inbox"
        inbox = pull_socket(ctx, address) if mode != "null" else None
        transfer = kv_transfer(args, worker, address)
        side = Side(build_scheduler(args, worker, transfer=transfer), worker)
        side.inbox = inbox
        side.transfer = transfer  # type: ignore[attr-defined]
        side.bootstrap = f"127.0.0.1:{args.disaggregation_bootstrap_port}"  # type: ignore[attr-defined]
        made.append(side)
        return side

    yield factory
    for side in made:
        side.scheduler.executor.close()
        if getattr(side, "transfer", None) is not None:
            side.transfer.close()
    ctx.destroy(linger=0)


def send_pair(p: Side, d: Side, rid: str, ids: list[int], room: int, **sampling: object) -> None:
    params = SamplingParams(**{"temperature": 0.0, **sampling})
    handoff = DisaggHandoff(p.bootstrap, room)  # type: ignore[attr-defined]
    p.scheduler.handle(TokenizedGenerateReq(rid, list(ids), params, handoff=handoff))
    d.scheduler.handle(TokenizedGenerateReq(rid, list(ids), params, handoff=handoff))


def run_pair(p: Side, d: Side, done: object) -> None:
    """Tick both until `done()`, handing each its transfer events."""
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"the pair did not finish: decode saw {d.finished}")
        busy = p.scheduler.has_work or d.scheduler.has_work
        p.pump(0 if busy else 20)
        d.pump(0)
        p.step()
        d.step()


def settle(p: Side, d: Side) -> None:
    """Run until neither side holds anything, then check both pools are whole."""
    run_pair(p, d, lambda: not p.scheduler.live_requests() and not d.scheduler.live_requests()
             and not p.scheduler.has_work and not d.scheduler.has_work)  # fmt: skip
    p.assert_all_free()
    d.assert_all_free()


PROMPTS = [list(range(5, 5 + n)) for n in (40, 97, 300)] + [[7, 9, 11] * 70]


@pytest.mark.parametrize("overlap", [False, True])
def test_greedy_outputs_equal_one_schedulers_and_decode_computes_no_prompt(make_side, overlap):
    loop = {"disable_overlap_schedule": not overlap, "enable_overlap_schedule": overlap}
    one, p, d = make_side("null", **loop), make_side("prefill", **loop), make_side("decode", **loop)
    for i, ids in enumerate(PROMPTS):
        one.submit(f"r{i}", ids, max_new_tokens=12)
        send_pair(p, d, f"r{i}", ids, room=1000 + i, max_new_tokens=12)
    one.run_until_idle()
    run_pair(p, d, lambda: len(d.finished) == len(PROMPTS))
    assert d.outputs == one.outputs
    assert all(d.finished[r].kind == "length" for r in one.outputs)
    assert all(len(p.outputs[r]) == 1 and p.outputs[r][0] == one.outputs[r][0] for r in one.outputs)
    total = sum(map(len, PROMPTS))
    assert d.scheduler.counters.computed_prompt_tokens == 0
    cached = p.scheduler.counters.cached_prompt_tokens  # the prompts share a prefix
    assert p.scheduler.counters.computed_prompt_tokens == total - cached
    settle(p, d)
    assert p.scheduler.stats().disagg_sent_tokens_total == total
    assert d.scheduler.stats().disagg_received_tokens_total == total



def test_bf16_greedy_outputs_equal_one_schedulers_one_request_at_a_time(make_side):
    """bf16 (`auto`'s choice on a CPU with native bf16): one request at a time, so every
    forward has the same batch on both paths and any difference is the hand-over's."""
    bf16 = {"dtype": "bfloat16"}
    one, p, d = make_side("null", **bf16), make_side("prefill", **bf16), make_side("decode", **bf16)
    for i, ids in enumerate(PROMPTS):
        one.submit(f"r{i}", ids, max_new_tokens=12)
        one.run_until_idle()
        send_pair(p, d, f"r{i}", ids, room=2000 + i, max_new_tokens=12)
        run_pair(p, d, lambda rid=f"r{i}": rid in d.finished)
    assert d.outputs == one.outputs
    assert d.scheduler.counters.computed_prompt_tokens == 0
    settle(p, d)

def test_a_request_that_ends_on_the_prefill_side_first_fails_on_the_decode_side(make_side):
    p, d = make_side("prefill"), make_side("decode")
    send_pair(p, d, "cut", list(range(5, 105)), room=1)
    p.abort("cut")  # e.g. its client (the router) went away before the prompt was computed
    run_pair(p, d, lambda: "cut" in d.finished)
    assert p.finished["cut"].kind == "abort"
    reason = d.finished["cut"]
    assert reason.kind == "error" and "ended on the prefill server" in reason.message
    settle(p, d)


def test_an_abort_on_the_decode_side_while_its_kv_is_due_frees_both_sides(make_side):
    p, d = make_side("prefill"), make_side("decode")
    send_pair(p, d, "gone", list(range(5, 205)), room=2, max_new_tokens=8)
    d.step()  # the decode side reserves and asks; the prefill side has not computed yet
    assert d.scheduler.receiver.receiving
    d.abort("gone")
    assert d.finished["gone"].kind == "abort"
    settle(p, d)  # the prefill side computes, then hears the room is given up


def test_a_prompt_larger_than_the_decode_pool_is_refused_and_a_full_pool_waits(make_side):
    p, d = make_side("prefill"), make_side("decode", max_total_tokens=256)
    send_pair(p, d, "huge", list(range(5, 305)), room=3, max_new_tokens=4)
    run_pair(p, d, lambda: "huge" in d.finished and "huge" in p.finished)
    assert "does not fit the context length 252" in d.finished["huge"].message
    # three that fit one at a time: the others wait for pages, then run
    for i in range(3):
        send_pair(p, d, f"w{i}", list(range(5 + i, 165 + i)), room=10 + i, max_new_tokens=6)
    run_pair(p, d, lambda: all(f"w{i}" in d.finished for i in range(3)))
    assert all(
        d.finished[f"w{i}"].kind == "length" and len(d.outputs[f"w{i}"]) == 6 for i in range(3)
    )
    settle(p, d)


def test_sampling_state_travels_so_a_seeded_request_samples_as_on_one_server(make_side):
    one, p, d = make_side("null"), make_side("prefill"), make_side("decode")
    kw = {"temperature": 0.9, "top_p": 0.95, "seed": 1234, "max_new_tokens": 10, "logprobs": True}
    one.submit("s", list(range(5, 80)), **kw)
    send_pair(p, d, "s", list(range(5, 80)), room=4, **kw)
    one.run_until_idle()
    run_pair(p, d, lambda: "s" in d.finished)
    assert d.outputs["s"] == one.outputs["s"]
    settle(p, d)


def test_lora_requests_keep_their_adapter_on_both_sides_against_peft(
    make_side, tiny_llama_path, tmp_path
):
    from lora_adapters import PeftOracle, make_adapter

    adapter = make_adapter(tiny_llama_path, tmp_path / "a8", rank=8, seed=1)
    lora = {"enable_lora": True, "lora_modules": (f"a8={adapter}",), "max_loras": 1}
    p, d = make_side("prefill", **lora), make_side("decode", **lora)
    prompts = [[5, 17, 33, 42, 9, 11], list(range(60, 160))]
    for i, ids in enumerate(prompts):
        send_pair(p, d, f"a{i}", ids, room=20 + i, max_new_tokens=10, ignore_eos=True, lora_id=1)
        send_pair(p, d, f"b{i}", ids, room=30 + i, max_new_tokens=10, ignore_eos=True)
    run_pair(p, d, lambda: len(d.finished) == 2 * len(prompts))
    oracle = PeftOracle(tiny_llama_path)
    for i, ids in enumerate(prompts):
        assert d.outputs[f"a{i}"] == oracle.generate(adapter, ids, 10)
        assert d.outputs[f"b{i}"] == oracle.generate(None, ids, 10)
        assert d.outputs[f"a{i}"] != d.outputs[f"b{i}"]  # the adapter changes the answer
    settle(p, d)
