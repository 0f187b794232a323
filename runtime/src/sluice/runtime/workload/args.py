"""The flags that choose a serving workload, declared once: `bench_serving`'s `BenchArgs`
and `sluice simulate`'s `SimulateArgs` both extend `WorkloadArgs`, so the same flags give
the same requests (prompts, lengths, arrivals) to the real server and to the simulator."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sluice.runtime.dataclass_cli import option
from sluice.runtime.workload import dataset


@dataclass(frozen=True)
class WorkloadArgs:
    dataset_name: str = option("random", "Prompt set.", dataset.DATASETS)
    num_prompts: int = option(64, "Number of requests.")
    random_input_len: int = option(512, "Longest prompt (shared-prefix: longest own part), tokens.")
    random_output_len: int = option(256, "Longest output, tokens.")
    random_range_ratio: float = option(0.25, "Lengths are uniform in [len * ratio, len].")
    random_input_min: int = option(0, "Shortest prompt, tokens (0: from --random-range-ratio).")
    random_output_min: int = option(0, "Shortest output, tokens (0: from --random-range-ratio).")
    shared_prefix_len: int = option(
        256, "shared-prefix: tokens of the prefix every prompt starts with."
    )
    num_prefixes: int = option(
        16, "multi-prefix: distinct prefixes (of --shared-prefix-len tokens), each used "
        "--num-prompts / --num-prefixes times, in a shuffled order.",
    )
    long_fraction: float = option(
        0.25, "long-short: the share of long prompts with short answers (prompts up to "
        "--random-input-len, answers up to --random-output-min); the others are short prompts "
        "(up to --random-input-min) with long answers (up to --random-output-len).",
    )
    seed: int = option(1, "Seed for lengths, prompts and arrivals.")
    request_rate: float = option(math.inf, "Requests per second, Poisson arrivals (inf: all at t=0).")
    max_concurrency: int = option(0, "Most requests in flight at once (0: no cap).")
    disable_ignore_eos: bool = option(False, "Let requests stop at EOS (outputs may be shorter).")

    def workload_problems(self) -> list[str]:
        problems = []
        if self.num_prompts < 1:
            problems.append("--num-prompts must be >= 1")
        if self.random_input_len < 1 or self.random_output_len < 1:
            problems.append("--random-input-len and --random-output-len must be >= 1")
        if not 0.0 <= self.random_range_ratio <= 1.0:
            problems.append("--random-range-ratio must be in [0, 1]")
        if self.request_rate <= 0:
            problems.append("--request-rate must be > 0 (inf: all at once)")
        if self.max_concurrency < 0:
            problems.append("--max-concurrency must be >= 0")
        if self.dataset_name in ("shared-prefix", "multi-prefix") and self.shared_prefix_len < 1:
            problems.append("--shared-prefix-len must be >= 1")
        if self.dataset_name == "multi-prefix" and (
            self.num_prefixes < 1 or self.num_prompts % self.num_prefixes
        ):
            problems.append("multi-prefix: --num-prompts must be a multiple of --num-prefixes")
        if self.dataset_name == "long-short" and (
            self.random_input_min < 1 or self.random_output_min < 1 or not 0.0 <= self.long_fraction <= 1.0
        ):
            problems.append("long-short: --random-input-min and --random-output-min must be >= 1 "
                            "and --long-fraction in [0, 1]")  # fmt: skip
        if self.random_input_min > self.random_input_len or self.random_output_min > self.random_output_len:
            problems.append("--random-*-min must not exceed --random-*-len")
        return problems


def build_dataset(
    args: WorkloadArgs, tokenizer: Any
) -> tuple[list[dataset.BenchRequest], dict[str, int]]:
    """The requests, and what the summary adds for this dataset."""
    common = dict(
        num_prompts=args.num_prompts,
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
        seed=args.seed,
        input_min=args.random_input_min,
        output_min=args.random_output_min,
    )
    if args.dataset_name == "shared-prefix":
        requests, shared = dataset.sample_shared_prefix_requests(
            tokenizer, shared_prefix_len=args.shared_prefix_len, **common
        )
        return requests, {"shared_prefix_tokens": shared}
    if args.dataset_name == "multi-prefix":
        requests, ideal = dataset.sample_multi_prefix_requests(
            tokenizer, num_prefixes=args.num_prefixes, prefix_len=args.shared_prefix_len, **common
        )
        return requests, {"ideal_cached_tokens": ideal}
    if args.dataset_name == "long-short":
        return dataset.sample_long_short_requests(tokenizer, long_fraction=args.long_fraction, **common), {}
    return dataset.sample_random_requests(tokenizer, **common), {}
