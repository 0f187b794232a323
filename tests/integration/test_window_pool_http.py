"""The sliding-window layers' own KV pool, through the real server, against transformers.

A tiny random Gemma 3 (window 12: layers 0, 1 and 3 slide, layer 2 is global) served with a
full pool of 512 tokens and a window pool of a quarter of that: four requests of 104 tokens
each running at once need 416 tokens in the full layers, but only their windows (and the
chunk being computed) in the sliding ones, so the window pool works only if pages outside
every window go back. A tiny random Mistral (window 12, every layer slides) is served with
a window pool of 128 tokens as its only K/V, its full pool page keys only. Prompts are
prefilled in chunks of 16 that cross the window's edge; the same prompts again hit the
radix cache over prefixes longer than the window; a second turn extends each conversation.
The oracle is transformers' greedy `generate` (eager, fp32) on the same folder; at idle the
scheduler's integrity check (window pages attached only to live pages, none leaked) has
passed.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from server_process import serve, wait_for
from tiny_windowed import (
    ALL_SLIDING_FAMILY,
    hf_greedy,
    load_hf,
    make_tiny_windowed,
    served_greedy,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT_LENS = (40, 48, 56, 64)
MAX_NEW = 40
COMMON = ("--dtype", "float32", "--page-size", "4", "--max-running-requests", "4",
          "--max-prefill-tokens", "32", "--chunked-prefill-size", "16")  # fmt: skip
# per family: its pool flags and the (full, window) pool sizes they give
POOLS = {
    "gemma3": (("--max-total-tokens", "512", "--swa-full-tokens-ratio", "0.25"), (512, 128)),
    # every layer slides: the flag sizes the window pool, the full pool's page keys cover
    # four requests at the model's 512-token context
    ALL_SLIDING_FAMILY: (("--max-total-tokens", "128"), (4 * (512 + 4), 128)),
}


@pytest.fixture(scope="module", params=sorted(POOLS))
def windowed(request, tmp_path_factory) -> tuple[str, Path, list, list, list, list]:
    """(family, folder, prompts, their continuations, second turns, their continuations)."""
    family = request.param
    folder = make_tiny_windowed(tmp_path_factory.mktemp(family), family, seed=5)
    hf = load_hf(folder)
    gen = torch.Generator().manual_seed(17)
    vocab = hf.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    first = [hf_greedy(hf, ids, MAX_NEW) for ids in prompts]
    seconds = [p + out + torch.randint(3, vocab, (8,), generator=gen).tolist()
               for p, out in zip(prompts, first, strict=True)]  # fmt: skip
    return family, folder, prompts, first, seconds, [hf_greedy(hf, ids, MAX_NEW) for ids in seconds]


def all_at_once(url: str, prompts: list[list[int]]) -> list[list[int]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda ids: served_greedy(url, ids, MAX_NEW), prompts))


@pytest.mark.parametrize("loop", ["--disable-overlap-schedule", "--enable-overlap-schedule"])
def test_window_pool_greedy_equals_transformers(windowed, tmp_path, loop) -> None:
    family, folder, prompts, first, seconds, second_out = windowed
    flags, sizes = POOLS[family]
    with serve(folder, tmp_path / "server.log", *COMMON, *flags, loop) as srv:
        stats = srv.info()["scheduler_stats"]
        assert (stats["max_total_tokens"], stats["swa_total_tokens"]) == sizes
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
    # idle: no live window, whatever the cache keeps (cached windows are taken back on need)
    assert stats["kv_token_usage"] == 0 and stats["swa_token_usage"] > 0


def test_in_bf16_the_window_pool_answers_as_one_pool(windowed, tmp_path) -> None:
    """The default CPU path (bf16, the compiled row-invariant kernels): where a sliding
    layer's K/V lives must not change a bit of the answer, so the window pool's greedy
    tokens equal one pool's (`--disable-hybrid-swa-memory`) on the same prompts, cached
    prefixes and second turns included. transformers is the oracle in fp32 above; in bf16 it
    rounds differently from the kernels, so here the single pool is."""
    family, folder, prompts, _, seconds, _ = windowed
    flags, _ = POOLS[family]
    answers = []
    for layout in ((), ("--disable-hybrid-swa-memory",)):
        bf16 = tuple("bfloat16" if f == "float32" else f for f in COMMON)
        extra = () if layout else flags  # one pool: the default budget
        with serve(folder, tmp_path / f"server{len(layout)}.log", *bf16, *extra, *layout) as srv:
            stats = srv.info()["scheduler_stats"]
            assert (stats["swa_total_tokens"] > 0) == (not layout)
            answers.append([all_at_once(srv.url, prompts), all_at_once(srv.url, prompts),
                            all_at_once(srv.url, seconds)])  # fmt: skip
    assert answers[0] == answers[1]
