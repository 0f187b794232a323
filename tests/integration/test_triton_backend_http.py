"""`sluice serve --attention-backend triton` (Triton's interpreter, CPU) answers exactly as
`--attention-backend torch` through the HTTP API: chunked prefill over a cached prefix,
page size 16, ragged concurrent decode."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from server_process import serve
from tiny_model import make_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARED = "The quick brown fox jumps over the lazy dog. " * 4
PROMPTS = [SHARED + "What is the capital of France?", SHARED + "Hello, world!", "Numbers: 0 1 2"]
MAX_TOKENS = 12
# fp32: the Triton kernels run fp32 on the CPU (under the interpreter); both backends compare alike
FLAGS = ("--page-size", "16", "--chunked-prefill-size", "16", "--max-total-tokens", "2048",
         "--dtype", "float32")  # fmt: skip


@pytest.fixture(scope="module")
def clear_margin_model(tmp_path_factory: pytest.TempPathFactory):
    # a wider init than HF's default: greedy tokens win by margins far above fp32 noise
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama-wide"), seed=7,
                           initializer_range=0.08)  # fmt: skip


async def _complete(url: str, prompts: list[str], concurrent: bool) -> list[str]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]

        async def one(prompt: str) -> str:
            r = await client.post("/v1/completions", json={
                "model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                "ignore_eos": True})  # fmt: skip
            r.raise_for_status()
            assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
            return r.json()["choices"][0]["text"]

        if concurrent:
            return list(await asyncio.gather(*(one(p) for p in prompts)))
        return [await one(p) for p in prompts]


def _answers(model, log, backend: str) -> tuple[list[str], list[str], dict]:
    with serve(model, log, *FLAGS, "--attention-backend", backend) as srv:
        one_by_one = asyncio.run(_complete(srv.url, PROMPTS, concurrent=False))
        together = asyncio.run(_complete(srv.url, PROMPTS, concurrent=True))
        info = srv.wait_idle()
    return one_by_one, together, info


def test_triton_backend_gives_the_torch_backends_greedy_tokens(
    clear_margin_model, tmp_path, monkeypatch
):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # inherited by the server's processes
    torch_sequential, torch_concurrent, _ = _answers(clear_margin_model, tmp_path / "t.log",
                                                     "torch")  # fmt: skip
    triton_sequential, triton_concurrent, info = _answers(
        clear_margin_model, tmp_path / "triton.log", "triton"
    )
    assert info["attention_backend"] == "triton"
    assert (tmp_path / "triton.log").read_text().count("attention backend: triton") == 1
    assert info["scheduler_stats"]["prefix_cache_hit_ratio"] > 0  # the shared prefix was reused
    assert triton_sequential == torch_sequential
    assert triton_concurrent == torch_concurrent
