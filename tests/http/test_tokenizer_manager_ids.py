"""The TokenizerManager gives each request an id of its own: a client's `rid` names the
request for the client only, so reusing one can never meet an older request inside."""

from __future__ import annotations

import asyncio
import contextlib

import zmq

from sluice.runtime.entrypoints.tokenizer_manager import TokenizerManager
from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    SamplingParams,
    SchedulerReady,
    TextUpdate,
    TokenizedGenerateReq,
)
from sluice.runtime.ipc.sockets import PortArgs, pull_socket, push_socket, recv, send

READY = SchedulerReady(1024, 4, 512, 1, 100, [2], "cpu", "float32", "torch")


def test_a_reused_client_rid_gets_a_new_internal_id_and_the_old_abort_cannot_reach_it():
    ports = PortArgs.fresh()
    ctx = zmq.Context()
    scheduler = pull_socket(ctx, ports.scheduler_input)
    tm = TokenizerManager(None, "m", READY, ports)
    to_tm = push_socket(ctx, ports.tokenizer_input)

    async def main() -> tuple[list[str], list[object]]:
        tm.start()
        seen: list[str] = []
        msgs: list[object] = []
        for _ in range(2):
            gen = tm.generate([5, 6], SamplingParams(max_new_tokens=1), rid="client-id")
            first = asyncio.ensure_future(gen.__anext__())
            await asyncio.sleep(0)
            msg = await asyncio.to_thread(recv, scheduler, 5000)
            assert isinstance(msg, TokenizedGenerateReq)
            seen.append(msg.rid)
            if len(seen) == 1:  # the first one is abandoned by its client: an abort goes out
                first.cancel()  # the handler's task is cancelled: the generator's finally runs
                with contextlib.suppress(asyncio.CancelledError):
                    await first
                msgs.append(await asyncio.to_thread(recv, scheduler, 5000))
            else:
                update = TextUpdate(msg.rid, "x", [7], [], FinishReason("length"), 2, 1, 0)
                send(to_tm, BatchStrOut([update]))
                chunk = await first
                msgs.append(chunk)
                await gen.aclose()
        return seen, msgs

    try:
        seen, msgs = asyncio.run(main())
    finally:
        tm.close()
        ctx.destroy(linger=0)
    assert "client-id" not in seen and seen[0] != seen[1]
    assert msgs[0] == AbortReq(seen[0])  # the abort names the old request only
    assert msgs[1].finished == FinishReason("length")
