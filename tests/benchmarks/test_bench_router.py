"""The benchmark's router mode and multi-prefix dataset (pure parts: no server)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.bench_serving import BenchArgs
from benchmarks.serving import dataset, router


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_multi_prefix_uses_each_long_prefix_equally_in_a_shuffled_order(word_tokenizer):
    requests, ideal = dataset.sample_multi_prefix_requests(
        word_tokenizer, num_prompts=32, num_prefixes=16, prefix_len=40, input_len=6,
        output_len=4, range_ratio=1.0, seed=5,
    )  # fmt: skip
    assert Counter(r.prefix_id for r in requests) == {i: 2 for i in range(16)}
    ids = [_encode(word_tokenizer, r.prompt) for r in requests]
    by_prefix: dict[int, list[list[int]]] = {}
    for r, i in zip(requests, ids, strict=True):
        by_prefix.setdefault(r.prefix_id, []).append(i)
    # prompts of one prefix share its 40 tokens (+ the separator); different prefixes
    # start with different tokens, so they share nothing
    for a, b in by_prefix.values():
        assert dataset.common_prefix_len(a, b) >= 40
    assert len({i[0] for i in ids}) == 16
    # the ideal: the second use of each prefix reuses its common prefix with the first
    assert ideal == sum(dataset.common_prefix_len(a, b) for a, b in by_prefix.values())
    # shuffled: not all first uses come first
    first_half = {r.prefix_id for r in requests[:16]}
    assert len(first_half) < 16
    again, ideal_again = dataset.sample_multi_prefix_requests(
        word_tokenizer, 32, 16, 40, 6, 4, 1.0, seed=5
    )
    assert again == requests and ideal_again == ideal


def test_multi_prefix_needs_the_prompts_to_divide_over_the_prefixes(word_tokenizer):
    with pytest.raises(ValueError, match="multiple"):
        dataset.sample_multi_prefix_requests(word_tokenizer, 10, 3, 8, 4, 4, 1.0, seed=1)
    with pytest.raises(SystemExit):
        BenchArgs.from_cli(["--dataset-name", "multi-prefix", "--num-prompts", "10",
                            "--num-prefixes", "3"])  # fmt: skip


def test_overhead_probes_need_a_router():
    with pytest.raises(SystemExit):
        BenchArgs.from_cli(["--overhead-probes", "5"])
    args = BenchArgs.from_cli(["--router-policy", "cache-aware", "--overhead-probes", "5"])
    assert args.router_policy == "cache-aware" and args.overhead_probes == 5


def test_the_fleet_puts_workers_on_the_ports_after_the_routers():
    assert router.worker_urls("http://127.0.0.1:30080", 2) == [
        "http://127.0.0.1:30081", "http://127.0.0.1:30082"]  # fmt: skip
    cmd = router.router_command("http://127.0.0.1:30080", ["http://w:1"], "least-load", ["-x"])
    assert cmd[cmd.index("--port") + 1] == "30080" and cmd[cmd.index("--policy") + 1] == "least-load"
    assert cmd[cmd.index("--worker-urls") + 1] == "http://w:1" and cmd[-1] == "-x"


def test_histogram_quantile_interpolates_like_prometheus():
    # 10 observations: 4 in (0, 1], 4 in (1, 2], 2 in (2, 4]
    buckets = [(1.0, 4), (2.0, 8), (4.0, 10), (float("inf"), 10)]
    assert router.histogram_quantile(0.5, buckets) == pytest.approx(1.25)  # rank 5
    assert router.histogram_quantile(0.9, buckets) == pytest.approx(3.0)  # rank 9
    assert router.histogram_quantile(0.2, buckets) == pytest.approx(0.5)
