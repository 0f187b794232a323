"""The sliding-window layers' own KV pool, through the real server, against transformers.

A tiny random Gemma 3 (window 12: layers 0, 1 and 3 slide, layer 2 is global) served with a
full pool of 512 tokens and a window pool of a quarter of that: four requests of 104 tokens
each running at once need 416 tokens in the full layers, but only their windows (and the
chunk being computed) in the sliding ones, so the window pool works only if pages outside
every window go back. Prompts are prefilled in chunks of 16 that cross the window's edge;
the same prompts again hit the radix cache over prefixes longer than the window; a second
turn extends each conversation. The oracle is transformers' greedy `generate` (eager,
fp32) on the same folder; at idle the scheduler's integrity check (window pages attached
only to live pages, none leaked) has passed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from server_process import serve, wait_for
from tiny_windowed import hf_greedy, load_hf, make_tiny_windowed, served_greedy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT_LENS = (40, 48, 56, 64)
MAX_NEW = 40
FLAGS = ("--dtype", "float32", "--page-size", "4", "--max-total-tokens", "512",
         "--swa-full-tokens-ratio", "0.25", "--max-running-requests", "4",
         "--max-prefill-tokens", "32", "--chunked-prefill-size", "16")  # fmt: skip


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list, list, list]:
    """(folder, prompts, their continuations, second turns, their continuations)."""
    folder = make_tiny_windowed(tmp_path_factory.mktemp("gemma3"), "gemma3", seed=5)
    hf = load_hf(folder)
    gen = torch.Generator().manual_seed(17)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    first = [hf_greedy(hf, ids, MAX_NEW) for ids in prompts]
    seconds = [p + out + torch.randint(3, vocab, (8,), generator=gen).tolist()
               for p, out in zip(prompts, first, strict=True)]  # fmt: skip
    return folder, prompts, first, seconds, [hf_greedy(hf, ids, MAX_NEW) for ids in seconds]


def all_at_once(url: str, prompts: list[list[int]]) -> list[list[int]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: served_greedy(url, ids, MAX_NEW), prompts))


@pytest.mark.parametrize("loop", ["--disable-overlap-schedule", "--enable-overlap-schedule"])
def test_window_pool_greedy_equals_transformers(gemma3, tmp_path, loop) -> None:
    folder, prompts, first, seconds, second_out = gemma3
    with serve(folder, tmp_path / "server.log", *FLAGS, loop) as srv:
        stats = srv.info()["scheduler_stats"]
        assert (stats["max_total_tokens"], stats["swa_total_tokens"]) == (512, 128)
        assert all_at_once(srv.url, prompts) == first
        checks = srv.wait_idle()["scheduler_stats"]["integrity_checks_total"]
        # the same prompts: cached prefixes longer than the window
        assert all_at_once(srv.url, prompts) == first
        assert all_at_once(srv.url, seconds) == second_out
        wait_for(lambda: srv.info()["scheduler_stats"]["integrity_checks_total"] > checks,
                 timeout=60)  # fmt: skip
        stats = srv.wait_idle()["scheduler_stats"]
    assert stats["prefix_cache_hit_ratio"] > 0
    assert stats["retractions_total"] == 0  # the window pool never ran short
