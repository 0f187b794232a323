"""Qwen3, Qwen3-MoE and Mixtral through the real server give transformers' greedy tokens.

Oracle: transformers' `generate` (greedy, no EOS stop) on the same folder. The server runs
fp32 with a pool too small for the four requests at once (an optimistic new-token ratio
admits them all, then decode retracts), in the loop each case names.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
from server_process import hold_env, serve, wait_for
from tiny_model import make_tiny_mixtral, make_tiny_qwen3, make_tiny_qwen3_moe

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

PROMPTS = [list(range(3, 43)), [5, 17, 33, 91], [9, 301, 77, 5, 12, 8], [250, 4, 64, 7, 19]]
MAX_NEW = 40
FLAGS = ("--dtype", "float32", "--max-total-tokens", "160", "--chunked-prefill-size", "16",
         "--max-running-requests", "8", "--init-new-token-ratio", "0.1")  # fmt: skip
MAKERS = {"qwen3": make_tiny_qwen3, "qwen3_moe": make_tiny_qwen3_moe, "mixtral": make_tiny_mixtral}
CASES = [("qwen3", "normal", 1), ("qwen3", "overlap", 1), ("qwen3_moe", "normal", 1),
         ("qwen3_moe", "overlap", 1), ("mixtral", "normal", 1), ("qwen3_moe", "normal", 2)]  # fmt: skip


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: make(tmp_path_factory.mktemp(name), seed=11, initializer_range=0.08)
            for name, make in MAKERS.items()}  # fmt: skip


def hf_greedy(folder: Path) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # as the server's ignore_eos
    outs = []
    with torch.inference_mode():
        for ids in PROMPTS:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False,
                              pad_token_id=0)  # fmt: skip
            outs.append(out[0, len(ids) :].tolist())
    assert all(len(o) == MAX_NEW for o in outs)
    return outs


def generate(url: str, ids: list[int]) -> list[int]:
    body = {"input_ids": ids, "sampling_params": {
        "max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    r = httpx.post(f"{url}/generate", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["output_ids"]


@pytest.mark.parametrize("name, loop, tp", CASES, ids=[f"{n}-{lp}-tp{tp}" for n, lp, tp in CASES])
def test_greedy_tokens_equal_transformers_generate(models, tmp_path, name, loop, tp):
    extra = "--enable-overlap-schedule" if loop == "overlap" else "--disable-overlap-schedule"
    hold, env = hold_env(tmp_path / "hold")
    with serve(models[name], tmp_path / "server.log", *FLAGS, extra, "--tensor-parallel-size", str(tp),
               env=env) as srv:  # fmt: skip
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            hold.pause()  # all four admitted at one tick: the pool must then retract
            futures = [pool.submit(generate, srv.url, ids) for ids in PROMPTS]
            wait_for(lambda: srv.info()["scheduler_stats"].get("queue_requests") == 4, 60)
            hold.resume()
            outputs = [f.result() for f in futures]
        stats = srv.wait_idle()["scheduler_stats"]
    assert outputs == hf_greedy(models[name])
    assert stats["retractions_total"] > 0  # the small pool forced re-prefills
