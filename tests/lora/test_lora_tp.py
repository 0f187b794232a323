"""Multi-LoRA with two tensor-parallel ranks (gloo, the CPU): the adapters' A and B are
split as the base weights are (Megatron layout), and a run-time load reaches every rank;
greedy tokens of a mixed concurrent batch equal PEFT's."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from lora_adapters import PeftOracle, make_adapter
from server_process import serve
from tiny_model import make_tiny_llama

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

PROMPTS = [[5, 17, 33, 42, 9, 11], [60, 61, 62, 63, 64, 65, 66, 67, 68]]
NEW = 8


@pytest.mark.parametrize("loop", ["normal", "overlap"])
def test_two_ranks_serve_each_adapter_as_peft_does(tmp_path, loop):
    # 4 query heads over 2 KV heads: each rank holds 2 and 1; 1 KV head per rank as well
    base = make_tiny_llama(tmp_path / "base", seed=7, initializer_range=0.08)
    adapters = {
        "a8": make_adapter(base, tmp_path / "a8", rank=8, seed=1),
        "b16": make_adapter(base, tmp_path / "b16", rank=16, seed=2, use_rslora=True),
    }
    oracle = PeftOracle(base)
    flags = ["--tensor-parallel-size", "2", "--enable-lora", "--lora-modules",
             f"a8={adapters['a8']}", "--max-loras", "2", "--dtype", "float32",
             "--max-total-tokens", "2048"]  # fmt: skip
    if loop == "overlap":
        flags.append("--enable-overlap-schedule")

    async def go(url: str) -> list[list[int]]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as client:
            r = await client.post("/v1/load_lora_adapter",
                                  json={"lora_name": "b16", "lora_path": str(adapters["b16"])})  # fmt: skip
            assert r.status_code == 200, r.text
            base_name = (await client.get("/v1/models")).json()["data"][0]["id"]

            async def one(model: str, prompt: list[int]) -> list[int]:
                r = await client.post("/v1/completions", json={
                    "model": model, "prompt": prompt, "max_tokens": NEW, "temperature": 0,
                    "ignore_eos": True, "return_token_ids": True})  # fmt: skip
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["token_ids"]

            jobs = [(m, p) for p in PROMPTS for m in (base_name, "a8", "b16")]
            outs = await asyncio.gather(*(one(m, p) for m, p in jobs))
            return list(zip(jobs, outs, strict=True))

    with serve(base, tmp_path / "tp2.log", *flags) as srv:
        results = asyncio.run(go(srv.url))
    for (model, prompt), got in results:
        assert got == oracle.generate(adapters.get(model), prompt, NEW), model
