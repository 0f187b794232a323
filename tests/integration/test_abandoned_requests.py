"""Nothing is lost when clients leave: streams whose clients disconnect mid-generation, an
abort storm (`/abort_request` with `abort_all`) and a soak of 1,000 requests, every fourth
abandoned mid-stream, all end with zero running, zero queued and the KV pool all free
(the server's own books: `free_tokens == max_total_tokens`, checked by the scheduler's
integrity check each time it goes idle).

The first two hold the streams open by construction (the hold gate admits them at one tick
and freezes the scheduler once every stream has its first token); the soak is a load test, marked slow.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from reliability_kit import StreamOutcome, stream_until_end, tree_rss_mib
from server_process import hold_env, serve, wait_for

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

STREAMS = 8


def generate(prompt: list[int], max_new_tokens: int, stream: bool = True) -> dict:
    return {"input_ids": prompt, "stream": stream,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                                "temperature": 0.0}}  # fmt: skip


async def first_event_then_leave(client: httpx.AsyncClient, url: str, body: dict) -> int:
    """Open a stream, read its first event, and close the connection; returns the status."""
    async with client.stream("POST", url + "/generate", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break
        return r.status_code


def assert_books_balance(srv) -> dict:
    info = srv.wait_idle(timeout=60)
    stats = info["scheduler_stats"]
    assert stats["running_requests"] == 0 and stats["queue_requests"] == 0, stats
    assert stats["free_tokens"] == stats["max_total_tokens"], stats
    assert stats["integrity_checks_total"] > 0, stats
    assert srv.proc.poll() is None, srv.log_tail()
    return stats


def admit_together(srv, hold, n: int) -> None:
    """Once the `n` requests sent during `hold.pause()` are all queued in the scheduler, arm
    the gate for their first tokens and let the scheduler run: they are admitted in one
    tick, so none can finish (or be left by its client) before the others run."""
    wait_for(lambda: srv.info()["scheduler_stats"]["queue_requests"] == n, timeout=60)
    hold.arm(1, n)
    hold.resume()


def test_streams_whose_clients_disconnect_give_their_pages_back(tiny_llama_path, tmp_path):
    hold, env = hold_env(tmp_path / "hold")
    with serve(tiny_llama_path, tmp_path / "server.log", env=env) as srv:
        hold.pause()

        async def leave_all() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                leaving = [
                    asyncio.ensure_future(
                        first_event_then_leave(client, srv.url, generate([5 + i, 6, 7], 400))
                    )
                    for i in range(STREAMS)
                ]
                await asyncio.to_thread(admit_together, srv, hold, STREAMS)
                return list(await asyncio.gather(*leaving))

        codes = asyncio.run(leave_all())
        held = hold.wait_held()
        assert codes == [200] * STREAMS
        assert held["running_requests"] == STREAMS
        assert held["free_tokens"] < held["max_total_tokens"]  # they hold pages while frozen
        # the API server saw every client go (the aborts wait in the frozen scheduler's inbox)
        wait_for(lambda: srv.info()["inflight_requests"] == 0)
        hold.release()
        assert_books_balance(srv)
        ok = httpx.post(srv.url + "/generate", json=generate([5, 6], 4, stream=False), timeout=60)
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 4


def test_an_abort_storm_ends_every_stream_in_band_and_frees_the_pool(tiny_llama_path, tmp_path):
    hold, env = hold_env(tmp_path / "hold")
    n = 2 * STREAMS
    with serve(tiny_llama_path, tmp_path / "server.log", env=env) as srv:
        hold.pause()

        async def storm() -> tuple[list[StreamOutcome], list[str]]:
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [
                    asyncio.ensure_future(
                        stream_until_end(
                            client, srv.url + "/generate", generate([3 + i, 4, 5], 400)
                        )
                    )  # fmt: skip
                    for i in range(n)
                ]
                await asyncio.to_thread(admit_together, srv, hold, n)
                await asyncio.to_thread(hold.wait_held)
                # one abort_all and one abort per request, all at once, while frozen
                aborts = await asyncio.gather(
                    client.post(srv.url + "/abort_request", json={"abort_all": True}),
                    *(client.post(srv.url + "/abort_request", json={"rid": f"nope-{i}"})
                      for i in range(n)),
                )  # fmt: skip
                assert all(r.status_code == 200 for r in aborts)
                hold.release()
                return list(await asyncio.gather(*tasks)), aborts[0].json()["aborted"]

        outcomes, aborted = asyncio.run(storm())
        assert len(aborted) == n
        for out in outcomes:
            assert out.status == 200 and out.done, out  # ended in band, with [DONE]
            last = [e for e in out.events if isinstance(e, dict)][-1]
            assert last["meta_info"]["finish_reason"]["type"] == "abort", last
        assert_books_balance(srv)


@pytest.mark.slow
def test_a_soak_with_every_fourth_client_leaving_loses_nothing_and_does_not_grow(
    tiny_llama_path, tmp_path
):
    total, in_flight = 1000, 16
    with serve(tiny_llama_path, tmp_path / "server.log") as srv:
        pid = srv.proc.pid
        rss: dict[int, float] = {}

        async def soak() -> list[int]:
            sem = asyncio.Semaphore(in_flight)
            finished = 0

            async def one(client: httpx.AsyncClient, i: int) -> int:
                nonlocal finished
                async with sem:
                    if i % 4 == 3:  # abandoned mid-stream
                        code = await first_event_then_leave(
                            client, srv.url, generate([1 + i % 200, 2, 3], 64)
                        )
                    else:
                        r = await client.post(
                            srv.url + "/generate", json=generate([1 + i % 200, 2], 8, stream=False)
                        )
                        code = r.status_code
                    finished += 1
                    if finished in (100, total):
                        rss[finished] = tree_rss_mib(pid)
                    return code

            async with httpx.AsyncClient(timeout=120) as client:
                return list(await asyncio.gather(*(one(client, i) for i in range(total))))

        codes = asyncio.run(soak())
        assert codes == [200] * total  # every request was answered
        assert_books_balance(srv)
        growth = rss[total] / rss[100] - 1
        print(f"soak RSS (MiB, all processes): {rss[100]:.0f} at 100, {rss[total]:.0f} at "
              f"{total}: {growth:+.1%}")  # fmt: skip
        assert growth < 0.10, rss
        assert httpx.get(srv.url + C.HEALTH_PATH, timeout=10).status_code == 200
