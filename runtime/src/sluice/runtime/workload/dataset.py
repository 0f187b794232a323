"""Benchmark prompts made of random tokens from the served model's own tokenizer.

A prompt is drawn as random token ids, decoded to text and re-encoded; ids are trimmed or
topped up until the text re-encodes to the target length (a few rounds at most), so the
length is exact for most tokenizers and off by a token or two for byte-level BPE at worst.
`prompt_len` is always the real count: `len(tokenizer.encode(prompt))` without special
tokens, never the target.

Lengths are drawn uniformly from `[max(int(len * ratio), 1), len]` like SGLang's random
dataset. Everything is a function of `seed`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DATASETS = ("random", "shared-prefix", "multi-prefix", "long-short")
# Put between the shared prefix and each request's own part, so that the prefix ends on a
# token boundary for the usual pre-tokenizers.
PREFIX_SEPARATOR = "\n\n"
_FIT_ROUNDS = 16


@dataclass(frozen=True)
class BenchRequest:
    prompt: str
    prompt_len: int  # tokens of `prompt` as the tokenizer re-encodes it (no special tokens)
    output_len: int  # the request's max_tokens (exact with ignore_eos)
    prefix_id: int | None = None  # multi-prefix: which prefix the prompt starts with


@dataclass(frozen=True)
class DatasetSummary:
    num_requests: int
    total_input_tokens: int
    total_output_tokens: int
    input_len_min: int
    input_len_mean: float
    input_len_max: int
    output_len_min: int
    output_len_mean: float
    output_len_max: int
    shared_prefix_tokens: int | None = None  # tokens every prompt starts with (shared-prefix)
    # multi-prefix: prompt tokens a prefix cache can reuse at best (every use of a prefix
    # after its first, each its longest common prefix with an earlier use)
    ideal_cached_tokens: int | None = None

    @classmethod
    def of(
        cls,
        requests: Sequence[BenchRequest],
        shared_prefix_tokens: int | None = None,
        ideal_cached_tokens: int | None = None,
    ) -> DatasetSummary:
        ins = [r.prompt_len for r in requests]
        outs = [r.output_len for r in requests]
        return cls(
            num_requests=len(requests),
            total_input_tokens=sum(ins),
            total_output_tokens=sum(outs),
            input_len_min=min(ins),
            input_len_mean=float(np.mean(ins)),
            input_len_max=max(ins),
            output_len_min=min(outs),
            output_len_mean=float(np.mean(outs)),
            output_len_max=max(outs),
            shared_prefix_tokens=shared_prefix_tokens,
            ideal_cached_tokens=ideal_cached_tokens,
        )


def sample_lengths(
    rng: np.random.Generator, length: int, range_ratio: float, n: int, low: int = 0
) -> list[int]:
    """`n` lengths drawn uniformly from `[max(int(length * range_ratio), 1), length]`, or
    from `[low, length]` when `low` > 0."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if not 0.0 <= range_ratio <= 1.0:
        raise ValueError(f"range ratio must be in [0, 1], got {range_ratio}")
    if low > length:
        raise ValueError(f"minimum length {low} exceeds the maximum {length}")
    low = low if low > 0 else max(int(length * range_ratio), 1)
    return [int(x) for x in rng.integers(low, length + 1, size=n)]


def token_pool(tokenizer: Any) -> np.ndarray:
    """Ids a random prompt may use: the vocabulary minus special and added tokens and minus
    byte-level pieces that are not whole characters (they decode to U+FFFD, which re-encodes
    to other tokens)."""
    excluded = set(tokenizer.all_special_ids)
    excluded |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    candidates = sorted(set(tokenizer.get_vocab().values()) - excluded)
    pieces = tokenizer.batch_decode([[i] for i in candidates])
    pool = [i for i, piece in zip(candidates, pieces, strict=True) if "\ufffd" not in piece]
    if not pool:
        raise ValueError("the tokenizer has no ordinary tokens to build prompts from")
    return np.asarray(pool, dtype=np.int64)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def random_text(
    tokenizer: Any, pool: np.ndarray, length: int, rng: np.random.Generator
) -> tuple[str, int]:
    """Text of random tokens that re-encodes to `length` tokens if it can; returns (text, real)."""
    ids = [int(i) for i in rng.choice(pool, size=length)]
    text = tokenizer.decode(ids)
    for _ in range(_FIT_ROUNDS):
        real = _encode(tokenizer, text)
        if len(real) == length:
            return text, length
        if len(real) > length:
            ids = real[:length]
        else:
            ids = real + [int(i) for i in rng.choice(pool, size=length - len(real))]
        text = tokenizer.decode(ids)
    return text, len(_encode(tokenizer, text))


def random_request(
    tokenizer: Any, pool: np.ndarray, prompt_len: int, output_len: int, rng: np.random.Generator
) -> BenchRequest:
    """A request of `random_text` (`prompt_len` tokens as it re-encodes) and `output_len`."""
    text, real = random_text(tokenizer, pool, prompt_len, rng)
    return BenchRequest(prompt=text, prompt_len=real, output_len=output_len)


def sample_random_requests(
    tokenizer: Any,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    input_min: int = 0,
    output_min: int = 0,
) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    input_lens = sample_lengths(rng, input_len, range_ratio, num_prompts, input_min)
    output_lens = sample_lengths(rng, output_len, range_ratio, num_prompts, output_min)
    pool = token_pool(tokenizer)
    return [
        random_request(tokenizer, pool, n_in, n_out, rng)
        for n_in, n_out in zip(input_lens, output_lens, strict=True)
    ]


def sample_shared_prefix_requests(
    tokenizer: Any,
    num_prompts: int,
    shared_prefix_len: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    input_min: int = 0,
    output_min: int = 0,
) -> tuple[list[BenchRequest], int]:
    """Prompts that all start with one `shared_prefix_len`-token system prefix.

    Each prompt is `prefix + PREFIX_SEPARATOR + own part`, the own part's length drawn like
    the random dataset's input length. Returns the requests and the number of leading
    tokens every prompt really shares with the prefix once tokenized (what a radix cache can
    reuse at best).
    """
    rng = np.random.default_rng(seed)
    input_lens = sample_lengths(rng, input_len, range_ratio, num_prompts, input_min)
    output_lens = sample_lengths(rng, output_len, range_ratio, num_prompts, output_min)
    pool = token_pool(tokenizer)
    prefix, _ = random_text(tokenizer, pool, shared_prefix_len, rng)
    prefix_ids = _encode(tokenizer, prefix)
    requests = []
    shared = len(prefix_ids)
    for n_in, n_out in zip(input_lens, output_lens, strict=True):
        own, _ = random_text(tokenizer, pool, n_in, rng)
        prompt = prefix + PREFIX_SEPARATOR + own
        ids = _encode(tokenizer, prompt)
        shared = min(shared, common_prefix_len(prefix_ids, ids))
        requests.append(BenchRequest(prompt=prompt, prompt_len=len(ids), output_len=n_out))
    return requests, shared


def sample_multi_prefix_requests(
    tokenizer: Any,
    num_prompts: int,
    num_prefixes: int,
    prefix_len: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    input_min: int = 0,
    output_min: int = 0,
) -> tuple[list[BenchRequest], int]:
    """Many long prefixes, each used a few times, in a shuffled order: the workload where
    routing by prefix matters (with few prefixes used many times, every replica warms up on
    all of them and round robin looks as good).

    `num_prompts / num_prefixes` uses per prefix (must divide). Each prefix is
    `prefix_len` random tokens starting with a token no other prefix starts with (so that
    prefixes share nothing), and each prompt is `prefix + PREFIX_SEPARATOR + own part`, the
    own part drawn like a random prompt. Returns the requests (in send order, with
    `prefix_id`) and the ideal cached tokens (see `DatasetSummary.ideal_cached_tokens`).
    """
    if num_prefixes < 1 or num_prompts % num_prefixes:
        raise ValueError(
            f"--num-prompts ({num_prompts}) must be a multiple of --num-prefixes ({num_prefixes})"
        )
    rng = np.random.default_rng([seed, 3])
    pool = token_pool(tokenizer)
    if num_prefixes > len(pool):
        raise ValueError(
            f"the tokenizer has {len(pool)} tokens, fewer than {num_prefixes} prefixes"
        )
    first_tokens = rng.choice(pool, size=num_prefixes, replace=False)
    prefixes = []
    for first in first_tokens:
        rest, _ = random_text(tokenizer, pool, max(prefix_len - 1, 1), rng)
        prefixes.append(tokenizer.decode([int(first), *_encode(tokenizer, rest)]))
    uses = num_prompts // num_prefixes
    input_lens = sample_lengths(rng, input_len, range_ratio, num_prompts, input_min)
    output_lens = sample_lengths(rng, output_len, range_ratio, num_prompts, output_min)
    order = rng.permutation(num_prompts)  # slot i of the send order is prefix order[i] // uses
    requests = []
    for i, slot in enumerate(order):
        pid = int(slot) // uses
        own, _ = random_text(tokenizer, pool, input_lens[i], rng)
        prompt = prefixes[pid] + PREFIX_SEPARATOR + own
        n = len(_encode(tokenizer, prompt))
        requests.append(BenchRequest(prompt, n, output_lens[i], prefix_id=pid))
    return requests, ideal_cached_tokens(tokenizer, requests)


def sample_long_short_requests(
    tokenizer: Any,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    seed: int,
    input_min: int = 0,
    output_min: int = 0,
    long_fraction: float = 0.25,
) -> list[BenchRequest]:
    """Two kinds of request, mixed in a random order: a `long_fraction` share of long
    prompts with short answers (prompts up to `input_len`, answers up to `output_min`), the
    rest short prompts with long answers (prompts up to `input_min`, answers up to
    `output_len`); each length uniform in [`range_ratio` x its longest, its longest]."""
    if input_min < 1 or output_min < 1:
        raise ValueError("long-short: --random-input-min (the longest short prompt) and "
                         "--random-output-min (the longest short answer) must be >= 1")  # fmt: skip
    rng = np.random.default_rng([seed, 5])
    pool = token_pool(tokenizer)
    is_long = rng.random(num_prompts) < long_fraction
    requests = []
    for long in is_long:
        prompt_max, out_max = (input_len, output_min) if long else (input_min, output_len)
        [n_in] = sample_lengths(rng, prompt_max, range_ratio, 1)
        [n_out] = sample_lengths(rng, out_max, range_ratio, 1)
        requests.append(random_request(tokenizer, pool, n_in, n_out, rng))
    return requests


def ideal_cached_tokens(tokenizer: Any, requests: Sequence[BenchRequest]) -> int:
    """What an unbounded prefix cache in front of every request could reuse: each request's
    longest common token prefix with an earlier request of the same prefix."""
    seen: dict[int | None, list[list[int]]] = {}
    total = 0
    for r in requests:
        ids = _encode(tokenizer, r.prompt)
        earlier = seen.setdefault(r.prefix_id, [])
        total += max((common_prefix_len(ids, e) for e in earlier), default=0)
        earlier.append(ids)
    return total


def warmup_request(
    tokenizer: Any, seed: int, prompt_len: int = 32, output_len: int = 16
) -> BenchRequest:
    """A short request unlike any in the dataset (its own random stream), so that warming
    the server up puts nothing in its prefix cache that a timed request could hit."""
    rng = np.random.default_rng([seed, 2])
    text, real = random_text(tokenizer, token_pool(tokenizer), prompt_len, rng)
    return BenchRequest(prompt=text, prompt_len=real, output_len=output_len)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
