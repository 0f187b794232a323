"""The same questions asked again: a server with its prefix cache answers exactly what a
server without one answers, in fp32 and in bf16 (the two dtypes `--dtype auto` picks), in
both loops.

Every server gets the same sequence of greedy requests: a chat question three times (the
repeats reuse all of the prompt but its last token), a second chat turn (many new tokens
after the cached first turn), and a completion prompt followed by that prompt extended by
1, 2, 5 and 40 tokens (each computes that many tokens after a cached prefix). The oracle is
a server of the same dtype started with `--disable-radix-cache`, which computes every
prompt from nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from server_process import serve

# three servers start per case: under a loaded machine that alone can pass the default 600 s
pytestmark = [pytest.mark.integration, pytest.mark.bundled, pytest.mark.slow, pytest.mark.timeout(1500)]

QUESTION = "What is the capital of France?"
FOLLOW_UP = "And what is the capital of Germany?"
PASSAGE = ("The river rises in the mountains, runs north through three valleys and a lake, "
           "and reaches the sea at a city whose harbour has been busy for two thousand years. "
           "Along the way it feeds farms, mills and towns, and it floods every few springs.")  # fmt: skip
EXTENSIONS = [1, 2, 5, 30]
MAX_TOKENS = 16  # greedy SmolLM2 can loop: every request is bounded


def _post(url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{url}{path}", json={**body, "temperature": 0, "max_tokens": MAX_TOKENS},
                   timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def conversation(url: str, passage_ids: list[int]) -> list[tuple[str, str, int]]:
    """The request sequence; per request (what, answer, cached prompt tokens)."""
    out = []
    first = [{"role": "user", "content": QUESTION}]
    answer = ""
    for attempt in range(3):
        reply = _post(url, "/v1/chat/completions", {"messages": first})
        answer = answer or reply["choices"][0]["message"]["content"]
        out.append((f"chat #{attempt + 1}", reply["choices"][0]["message"]["content"],
                    reply["usage"]["prompt_tokens_details"]["cached_tokens"]))  # fmt: skip
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": FOLLOW_UP}]
    reply = _post(url, "/v1/chat/completions", {"messages": second})
    out.append(("second turn", reply["choices"][0]["message"]["content"],
                reply["usage"]["prompt_tokens_details"]["cached_tokens"]))  # fmt: skip
    base = passage_ids[: len(passage_ids) - max(EXTENSIONS)]
    for extra in [0, *EXTENSIONS]:
        reply = _post(url, "/v1/completions", {"prompt": passage_ids[: len(base) + extra]})
        details = reply["usage"].get("prompt_tokens_details") or {}
        out.append((f"prompt + {extra}", reply["choices"][0]["text"], details.get("cached_tokens", 0)))
    return out


@pytest.fixture(scope="module")
def passage_ids(bundled_model_path: Path) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(bundled_model_path))(PASSAGE)["input_ids"]
    assert len(ids) > max(EXTENSIONS) + 16
    return ids


def _answers(tmp_path: Path, name: str, passage_ids: list[int], *flags: str) -> list[tuple[str, str, int]]:
    with serve("smollm2-135m", tmp_path / f"{name}.log", *flags) as srv:
        result = conversation(srv.url, passage_ids)
        srv.wait_idle()
    return result


# each dtype forced: `auto` picks bf16 on CPUs with native bf16 and fp32 elsewhere, so a test
# that left it to `auto` would test a different path on a different machine
@pytest.mark.parametrize("dtype_flags", [("--dtype", "float32"), ("--dtype", "bfloat16")],
                         ids=["fp32", "bf16"])  # fmt: skip
def test_cached_prefix_answers_equal_uncached(tmp_path: Path, passage_ids: list[int],
                                              dtype_flags: tuple[str, ...]) -> None:  # fmt: skip
    reference = _answers(tmp_path, "uncached", passage_ids, *dtype_flags, "--disable-radix-cache")
    assert all(cached == 0 for _, _, cached in reference)
    assert "Paris" in reference[0][1]
    loops = {"normal loop": (), "overlap loop": ("--enable-overlap-schedule",)}
    for loop, loop_flags in loops.items():
        got = _answers(tmp_path, loop.replace(" ", "-"), passage_ids, *dtype_flags, *loop_flags)
        for (what, answer, cached), (_, expected, _) in zip(got, reference, strict=True):
            assert answer == expected, f"{loop}, {what}: {answer!r} != uncached {expected!r}"
            if what not in ("chat #1", "prompt + 0") and not what.startswith("second"):
                assert cached > 0, f"{loop}, {what}: the prefix cache was not used"
