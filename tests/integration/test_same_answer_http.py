"""Same question, same answer, through the real server and the bundled SmolLM2 in bf16 (forced:
on a CPU with native bf16 it is what `--dtype auto` picks; elsewhere it runs emulated, the
same kernels' AVX2 path).

The default configuration: sixteen short chat questions (the README's among them) asked a
second time get their first answer back, token for token and log-prob for log-prob; asked
all at once (queued while the scheduler is paused, so they share batches) they get it too;
a second chat turn, whose first turn sits in the prefix cache, gets what a server without the
prefix cache gives.

`--enable-deterministic-inference` in bf16, SGLang's three modes: single (asked again),
mixed (inside a busy batch with a long prompt beside it) and prefix (a prompt whose long
prefix another prompt cached first).
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import hold_env, serve, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.bundled, pytest.mark.slow,
              pytest.mark.timeout(1200)]  # fmt: skip

QUESTIONS = [
    "What is the capital of France?", "What is the capital of Japan?",
    "How many legs does a spider have?", "What colour is the sky on a clear day?",
    "Who wrote Romeo and Juliet?", "What is two plus two?", "Name a planet in our solar system.",
    "What is the boiling point of water?", "What do bees make?", "What is the largest ocean?",
    "Translate 'thank you' into French.", "What is the opposite of hot?",
    "Give me a word that rhymes with cat.", "What language is spoken in Brazil?",
    "How many days are in a week?", "What gas do plants take in?",
]  # fmt: skip
FOLLOW_UP = "Tell me one more fact about it."
MAX_TOKENS = 16  # greedy SmolLM2 can loop: every request is bounded
BF16 = ("--dtype", "bfloat16")
Answer = tuple[str, list[float]]


def chat(url: str, messages: list[dict[str, str]]) -> Answer:
    body = {"messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def ask(url: str, question: str) -> Answer:
    return chat(url, [{"role": "user", "content": question}])


def second_turn(url: str, question: str, answer: str) -> Answer:
    return chat(url, [{"role": "user", "content": question},
                      {"role": "assistant", "content": answer},
                      {"role": "user", "content": FOLLOW_UP}])  # fmt: skip


def all_at_once(url: str, hold: Any, jobs: list[Any]) -> list[Any]:
    """Run `jobs` (callables) concurrently, queued while the scheduler is paused so that
    they are admitted together and share batches."""
    hold.pause()
    try:
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            futures = [pool.submit(job) for job in jobs]
            wait_for(lambda: httpx.get(f"{url}/server_info", timeout=10).json()
                     .get("scheduler_stats", {}).get("queue_requests", 0) >= len(jobs),
                     timeout=60, what="every request queued at the paused scheduler")  # fmt: skip
            hold.resume()
            return [f.result() for f in futures]
    finally:
        hold.resume()


def test_the_default_configuration_answers_a_question_asked_again_alike(
    tmp_path: Path, bundled_model_path: Path
) -> None:
    hold, env = hold_env(tmp_path / "hold")
    with serve(bundled_model_path, tmp_path / "cached.log", *BF16, env=env) as srv:
        first = [ask(srv.url, q) for q in QUESTIONS]
        assert "Paris" in first[0][0]
        again = [ask(srv.url, q) for q in QUESTIONS]
        turns = [second_turn(srv.url, q, a) for q, (a, _) in zip(QUESTIONS, first, strict=True)]
        together = all_at_once(srv.url, hold, [lambda q=q: ask(srv.url, q) for q in QUESTIONS])
        srv.wait_idle()
    with serve(bundled_model_path, tmp_path / "uncached.log", *BF16, "--disable-radix-cache") as ref:
        ref_first = [ask(ref.url, q) for q in QUESTIONS]
        ref_turns = [second_turn(ref.url, q, a) for q, (a, _) in zip(QUESTIONS, first, strict=True)]
    for i, question in enumerate(QUESTIONS):
        assert again[i] == first[i], f"{question!r} asked again"
        assert together[i] == first[i], f"{question!r} among {len(QUESTIONS)} at once"
        assert first[i] == ref_first[i], f"{question!r}: prefix cache on vs off"
        assert turns[i] == ref_turns[i], f"{question!r}, second turn: prefix cache on vs off"


def _complete(url: str, prompt: str) -> Answer:
    body = {"prompt": prompt, "temperature": 0, "max_tokens": MAX_TOKENS, "logprobs": 1}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["text"], choice["logprobs"]["token_logprobs"]


def test_deterministic_inference_in_bf16_single_mixed_and_prefix(
    tmp_path: Path, bundled_model_path: Path
) -> None:
    hold, env = hold_env(tmp_path / "hold")
    passage = " ".join(f"Item {i} of the list is the word {w}." for i, w in
                       enumerate("river stone cloud maple anchor lantern violet harbor".split()))  # fmt: skip
    flags = (*BF16, "--enable-deterministic-inference")
    with serve(bundled_model_path, tmp_path / "deterministic.log", *flags, env=env) as srv:
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
        assert info["dtype"] == "bfloat16"
        # single: alone, then again
        alone = [ask(srv.url, q) for q in QUESTIONS[:4]]
        assert [ask(srv.url, q) for q in QUESTIONS[:4]] == alone
        # prefix: the passage with one question, computed before anything cached the passage
        suffix = " Question: which word is item 5? Answer:"
        fresh = _complete(srv.url, passage + suffix)
        _complete(srv.url, passage + " Question: which word is item 2? Answer:")
        assert _complete(srv.url, passage + suffix) == fresh  # its prefix now from the cache
        # mixed: the same requests inside one busy batch, a long prompt beside them
        jobs = [lambda q=q: ask(srv.url, q) for q in QUESTIONS]
        jobs.append(lambda: _complete(srv.url, passage * 3))
        jobs.append(lambda: _complete(srv.url, passage + suffix))
        busy = all_at_once(srv.url, hold, jobs)
        assert busy[:4] == alone
        assert busy[-1] == fresh
        srv.wait_idle()
