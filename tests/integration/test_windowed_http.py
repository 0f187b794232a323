"""Windowed-attention models through the real server give transformers' `generate` tokens.

Tiny random Gemma 3 and Gemma 2 (and gpt-oss) models with windows of 8-12 tokens
(`tiny_windowed`); prompts of 40-64 tokens and 40 greedy tokens each, sent together to a
pool too small for all of them (so requests retract and are prefilled again, prompt plus
what they had generated), prefilled in chunks of 16 over cached prefixes longer than the
window, in both loops, and with two tensor-parallel ranks. The oracle is transformers'
greedy `generate` (eager attention, fp32) on the same folder.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from server_process import hold_env, serve, wait_for
from tiny_windowed import hf_greedy, load_hf, make_tiny_windowed, served_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.heavy]

PROMPT_LENS = (40, 48, 56, 64)
MAX_NEW = 40
# 208 prompt tokens do not fit 160 at once; an optimistic ratio admits what fits, which then
# outgrow the pool and retract
FLAGS = ("--dtype", "float32", "--page-size", "16", "--max-total-tokens", "160",
         "--chunked-prefill-size", "16", "--init-new-token-ratio", "0.1")  # fmt: skip
CASES = [("gemma3", "normal", 1), ("gemma3", "overlap", 1), ("gemma3", "overlap", 2),
         ("gemma2", "normal", 1), ("gemma2", "overlap", 1), ("gpt_oss", "normal", 1),
         ("gpt_oss", "overlap", 1)]  # fmt: skip


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list, list]]:
    """family -> (folder, prompts, transformers' greedy continuations)."""
    out = {}
    for family in sorted({c[0] for c in CASES}):
        folder = make_tiny_windowed(tmp_path_factory.mktemp(family), family, seed=3)
        hf = load_hf(folder)
        gen = torch.Generator().manual_seed(11)
        vocab = hf.config.vocab_size
        prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]
        out[family] = (folder, prompts, [hf_greedy(hf, ids, MAX_NEW) for ids in prompts])
    return out


@pytest.mark.parametrize("family, loop, tp", CASES, ids=[f"{f}-{lp}-tp{t}" for f, lp, t in CASES])
def test_greedy_tokens_through_http_equal_transformers_generate(windowed, tmp_path, family,
                                                                loop, tp) -> None:  # fmt: skip
    folder, prompts, expected = windowed[family]
    loop_flag = "--enable-overlap-schedule" if loop == "overlap" else "--disable-overlap-schedule"
    flags = (*FLAGS, loop_flag, "--tensor-parallel-size", str(tp))
    hold, env = hold_env(tmp_path / "hold")
    with serve(folder, tmp_path / "server.log", *flags, env=env) as srv:
        queued = lambda: srv.info()["scheduler_stats"].get("queue_requests")  # noqa: E731
        with ThreadPoolExecutor(len(prompts)) as pool:
            hold.pause()  # all four admitted at one tick: the pool is then too small
            futures = []
            for i, ids in enumerate(prompts):
                futures.append(pool.submit(served_greedy, srv.url, ids, MAX_NEW))
                wait_for(lambda i=i: queued() == i + 1, timeout=60)
            hold.resume()
            outputs = [f.result() for f in futures]
        stats = srv.wait_idle()["scheduler_stats"]
    assert outputs == expected
    assert stats["retractions_total"] > 0
