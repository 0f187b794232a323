"""Engine faults against a real server, as its clients see them: a forward that raises
(the test-only hook, `SLUICE_TEST_FAULTS`) loses its batch and the server serves on; an
unrecoverable one, or a child process killed, answers every client and the server exits
non-zero (vLLM's shutdown tests assert the same bounds: streams end within 10 s, the server
exits within 15 s).

Streams are held open by construction: the scheduler's hold gate freezes it once every
stream has its first token, and the fault or the kill happens while they are frozen.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest
from reliability_kit import PADDED_VOCAB, TOKENIZER_SIZE, StreamOutcome, make_padded_llama
from reliability_kit import stream_until_end as stream
from server_process import hold_env, serve, wait_for

from sluice.runtime import constants as C
from sluice.runtime.testing.fault_injection import ENV_FAULTS

pytestmark = pytest.mark.integration

POISON = TOKENIZER_SIZE + 7  # a valid id of the padded model no text ever tokenizes to
FATAL = TOKENIZER_SIZE + 9
assert FATAL < PADDED_VOCAB
STREAMS = 8


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return make_padded_llama(tmp_path_factory.mktemp("padded-llama"))


def generate(prompt: list[int], max_new_tokens: int = 6, stream: bool = False) -> dict:
    return {"input_ids": prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                "temperature": 0.0}}  # fmt: skip


def test_a_failed_forward_answers_its_request_with_a_500_and_the_server_serves_on(model, tmp_path):
    env = {ENV_FAULTS: f"forward_token={POISON}"}
    with serve(model, tmp_path / "server.log", env=env) as srv:
        before = httpx.post(srv.url + "/generate", json=generate([5, 6, 7]), timeout=60)
        assert before.status_code == 200
        r = httpx.post(srv.url + "/generate", json=generate([5, POISON, 7]), timeout=60)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "engine_error" and err["type"] == "server_error"
        assert "injected forward fault" in err["message"]
        outcome = asyncio.run(_stream_one(srv.url, generate([POISON, 8], 6, stream=True)))
        assert outcome.status == 200 and outcome.error is not None, outcome
        assert "injected forward fault" in outcome.error["message"]
        after = httpx.post(srv.url + "/generate", json=generate([5, 6, 7]), timeout=60)
        assert after.status_code == 200
        assert after.json()["output_ids"] == before.json()["output_ids"]  # the engine is intact
        assert "Traceback" in srv.log_tail(400)  # the cause is logged with its traceback
        info = srv.wait_idle()
        assert info["scheduler_stats"]["failed_batches_total"] == 2
        assert srv.proc.poll() is None


async def _stream_one(url: str, body: dict) -> StreamOutcome:
    async with httpx.AsyncClient(timeout=60) as client:
        return await stream(client, url + "/generate", body)


def test_an_unrecoverable_fault_answers_every_client_and_the_server_exits_non_zero(model, tmp_path):
    """The fatal request, one running beside it and one queued behind them (one slot
    each): all three are answered with an error, and the server exits 1."""
    hold, env = hold_env(tmp_path / "hold")
    env[ENV_FAULTS] = f"fatal_token={FATAL}"
    flags = ("--max-running-requests", "2")
    with serve(model, tmp_path / "server.log", *flags, env=env) as srv:
        hold.pause()  # all three reach the scheduler before anything runs

        async def three() -> list[StreamOutcome]:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = []
                for prompt in ([FATAL, 5, 6], [7, 8, 9], [10, 11, 12]):
                    body = generate(prompt, 200, stream=True)
                    tasks.append(asyncio.ensure_future(stream(client, srv.url + "/generate", body)))
                    await asyncio.to_thread(_wait_inflight, srv, len(tasks))
                hold.resume()
                return list(await asyncio.gather(*tasks))

        outcomes = asyncio.run(three())
        for out in outcomes:
            assert out.error is not None or out.closed_early, out
            if out.error is not None:
                assert out.error["type"] == "server_error"
        code = srv.proc.wait(timeout=15)
        assert code != 0
        assert "unrecoverable engine fault" in srv.log_tail(400)


def _wait_inflight(srv, n: int) -> None:
    wait_for(lambda: srv.info()["inflight_requests"] == n)


@pytest.mark.parametrize("child", ["scheduler", "detokenizer"])
def test_a_killed_child_ends_every_stream_and_the_server_exits_non_zero(model, tmp_path, child):
    hold, env = hold_env(tmp_path / "hold")
    with serve(model, tmp_path / "server.log", env=env) as srv:
        pid = srv.info()["processes"][child]
        hold.arm(1, STREAMS)  # freeze once all eight streams have their first token

        async def eight() -> tuple[list[StreamOutcome], float]:
            async with httpx.AsyncClient(timeout=60) as client:
                started = [asyncio.Event() for _ in range(STREAMS)]
                tasks = [
                    asyncio.ensure_future(
                        stream(
                            client,
                            srv.url + "/generate",
                            generate([5 + i, 6, 7], 400, stream=True),
                            started[i],
                        )  # fmt: skip
                    )
                    for i in range(STREAMS)
                ]
                await asyncio.to_thread(hold.wait_held)
                await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                hold.release()  # the other child goes on as it would
                return list(await asyncio.gather(*tasks)), killed_at

        outcomes, killed_at = asyncio.run(eight())
        for out in outcomes:
            assert out.status == 200 and (out.error is not None or out.closed_early), out
            assert out.ended_at - killed_at < 10, out.ended_at - killed_at
        code = srv.proc.wait(timeout=max(1.0, 15 - (time.monotonic() - killed_at)))
        assert code != 0
        assert f"the {child} process exited with code -9" in srv.log_tail(400)
        with pytest.raises(httpx.TransportError):
            httpx.get(srv.url + C.HEALTH_PATH, timeout=5)


def test_the_watchdog_answers_every_client_of_a_hung_scheduler_and_exits_non_zero(
    model, tmp_path
):
    """A real hang: the scheduler is stopped (SIGSTOP) with four streams frozen
    mid-generation; past --watchdog-timeout every stream ends with an error and the
    server exits non-zero (a restart is what fixes a hang)."""
    hold, env = hold_env(tmp_path / "hold")
    watchdog_s = 3
    flags = (C.FLAG_SCHEDULER_HEARTBEAT_TIMEOUT, "1", C.FLAG_WATCHDOG_TIMEOUT, str(watchdog_s))
    with serve(model, tmp_path / "server.log", *flags, env=env) as srv:
        pid = srv.info()["processes"]["scheduler"]
        hold.arm(1, 4)

        async def four() -> tuple[list[StreamOutcome], float]:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [
                    asyncio.ensure_future(
                        stream(client, srv.url + "/generate",
                               generate([20 + i, 6, 7], 400, stream=True))  # fmt: skip
                    )
                    for i in range(4)
                ]
                await asyncio.to_thread(hold.wait_held)
                os.kill(pid, signal.SIGSTOP)
                stopped_at = time.monotonic()
                hold.release()  # it stays stopped: the hang is the signal's, not the gate's
                return list(await asyncio.gather(*tasks)), stopped_at

        outcomes, stopped_at = asyncio.run(four())
        for out in outcomes:
            assert out.error is not None or out.closed_early, out
            if out.error is not None:
                assert "watchdog" in out.error["message"], out.error
            assert out.ended_at - stopped_at < watchdog_s + 10
        code = srv.proc.wait(timeout=max(1.0, watchdog_s + 15 - (time.monotonic() - stopped_at)))
        assert code != 0
        assert "watchdog: the scheduler sent nothing" in srv.log_tail(400)
