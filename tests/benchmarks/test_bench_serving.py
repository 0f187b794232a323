"""The serving benchmark's parts that need no server: dataset, metrics, SSE reading, CLI.

The benchmark itself never runs here (benchmarks are not part of the test run); the load
generator is driven through httpx's in-process MockTransport.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import sys
import textwrap

import httpx
import numpy as np
import pytest

from benchmarks.bench_serving import BenchArgs
from benchmarks.serving import client, dataset, metrics, peer, report, server
from benchmarks.serving.dataset import BenchRequest
from benchmarks.serving.metrics import LatencySummary, PeerBatch, RequestResult

# --- dataset ------------------------------------------------------------------------------


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_random_prompts_have_the_drawn_lengths_and_report_real_counts(word_tokenizer):
    requests = dataset.sample_random_requests(word_tokenizer, 50, 40, 30, 0.25, seed=3)
    expected_in = dataset.sample_lengths(np.random.default_rng(3), 40, 0.25, 50)
    assert [r.prompt_len for r in requests] == expected_in
    assert all(r.prompt_len == len(_encode(word_tokenizer, r.prompt)) for r in requests)


def test_byte_level_bpe_prompts_reencode_to_their_target_length(byte_bpe_tokenizer):
    pool = dataset.token_pool(byte_bpe_tokenizer)
    rng = np.random.default_rng(0)
    for length in [1, 2, 7, 33, 128, 300]:
        text, real = dataset.random_text(byte_bpe_tokenizer, pool, length, rng)
        assert real == len(_encode(byte_bpe_tokenizer, text)) == length


def test_same_seed_gives_the_same_dataset_and_another_seed_does_not(word_tokenizer):
    first = dataset.sample_random_requests(word_tokenizer, 20, 64, 32, 0.5, seed=7)
    again = dataset.sample_random_requests(word_tokenizer, 20, 64, 32, 0.5, seed=7)
    other = dataset.sample_random_requests(word_tokenizer, 20, 64, 32, 0.5, seed=8)
    assert first == again
    assert first != other


@pytest.mark.parametrize(
    ("length", "ratio", "low"), [(512, 0.25, 128), (256, 0.0, 1), (100, 1.0, 100), (3, 0.5, 1)]
)
def test_lengths_stay_within_the_range_ratio_bounds(length, ratio, low):
    lengths = dataset.sample_lengths(np.random.default_rng(0), length, ratio, 2000)
    assert min(lengths) >= low
    assert max(lengths) <= length
    if low < length:
        assert min(lengths) == low and max(lengths) == length  # both ends are reachable


def test_output_lengths_follow_the_range_ratio(word_tokenizer):
    requests = dataset.sample_random_requests(word_tokenizer, 200, 16, 256, 0.25, seed=1)
    assert all(64 <= r.output_len <= 256 for r in requests)
    assert all(4 <= r.prompt_len <= 16 for r in requests)


@pytest.mark.parametrize("ratio", [-0.1, 1.5])
def test_a_range_ratio_outside_zero_to_one_is_rejected(ratio):
    with pytest.raises(ValueError, match="range ratio"):
        dataset.sample_lengths(np.random.default_rng(0), 10, ratio, 1)


def test_prompts_contain_no_special_tokens(word_tokenizer, byte_bpe_tokenizer):
    for tok in (word_tokenizer, byte_bpe_tokenizer):
        special = set(tok.all_special_ids)
        for r in dataset.sample_random_requests(tok, 10, 50, 8, 0.5, seed=2):
            assert not special & set(_encode(tok, r.prompt))


def test_shared_prefix_prompts_start_with_the_same_tokens(word_tokenizer):
    requests, shared = dataset.sample_shared_prefix_requests(
        word_tokenizer,
        12,
        shared_prefix_len=30,
        input_len=20,
        output_len=8,
        range_ratio=0.5,
        seed=4,
    )
    assert shared == 30
    heads = {tuple(_encode(word_tokenizer, r.prompt)[:30]) for r in requests}
    assert len(heads) == 1
    assert all(40 <= r.prompt_len <= 50 for r in requests)  # prefix + own part of 10..20
    assert len({r.prompt for r in requests}) == 12


def test_dataset_summary_counts_tokens(word_tokenizer):
    reqs = [BenchRequest("a", 10, 5), BenchRequest("b", 30, 7)]
    s = dataset.DatasetSummary.of(reqs)
    assert (s.total_input_tokens, s.total_output_tokens) == (40, 12)
    assert (s.input_len_min, s.input_len_mean, s.input_len_max) == (10, 20.0, 30)


# --- metrics ------------------------------------------------------------------------------


def _ok(e2e, ttft, tokens, itl=(), send=0.0, prompt=10, asked=None):
    return RequestResult(
        prompt_len=prompt,
        output_len=tokens if asked is None else asked,
        success=True,
        output_tokens=tokens,
        ttft=ttft,
        itl=tuple(itl),
        e2e=e2e,
        send_time=send,
        usage_reported=True,
    )


def test_latency_summary_uses_mean_median_and_interpolated_p99():
    s = LatencySummary.of([0.1, 0.2, 0.3, 0.4])
    assert s.mean_ms == pytest.approx(250.0)
    assert s.median_ms == pytest.approx(250.0)
    assert s.p99_ms == pytest.approx(397.0)  # 0.3 + 0.97 * 0.1, numpy's linear percentile
    assert LatencySummary.of([]) is None


def test_tpot_excludes_the_first_token():
    assert _ok(e2e=1.1, ttft=0.2, tokens=10).tpot == pytest.approx(0.1)
    assert _ok(e2e=1.0, ttft=1.0, tokens=1).tpot is None


def test_metrics_on_synthetic_timings():
    results = [
        _ok(e2e=2.0, ttft=0.5, tokens=4, itl=[0.5, 0.5, 0.5], send=0.0, prompt=100),
        _ok(e2e=1.0, ttft=0.1, tokens=10, itl=[0.1] * 9, send=1.0, prompt=50, asked=12),
        RequestResult(prompt_len=70, output_len=8, success=False, e2e=0.5, send_time=0.5),
    ]
    m = metrics.compute_metrics(results, duration_s=4.0)
    assert (m.completed, m.failed) == (2, 1)
    assert (m.total_input_tokens, m.total_output_tokens) == (150, 14)
    assert m.request_throughput == pytest.approx(0.5)
    assert m.input_throughput == pytest.approx(37.5)
    assert m.output_throughput == pytest.approx(3.5)
    assert m.total_throughput == pytest.approx(41.0)
    assert m.ttft.mean_ms == pytest.approx(300.0)
    assert m.tpot.mean_ms == pytest.approx((500.0 + 100.0) / 2)
    assert m.itl.median_ms == pytest.approx(100.0)  # ITL is pooled: 3 gaps of .5, 9 of .1
    assert m.itl.mean_ms == pytest.approx((1.5 + 0.9) / 12 * 1000)
    assert m.e2e.p99_ms == pytest.approx(1990.0)
    assert m.mean_concurrency == pytest.approx(3.0 / 4.0)
    assert m.peak_concurrency == 2  # [0, 2] overlaps [0.5, 1] and [1, 2]
    assert m.output_len_mismatches == 1


def test_peak_concurrency_counts_overlaps_not_touching_intervals():
    assert metrics.peak_concurrency([(0, 1), (1, 2), (2, 3)]) == 1
    assert metrics.peak_concurrency([(0, 10)] + [(i, i + 0.5) for i in range(5)]) == 2
    assert metrics.peak_concurrency([(0, 5)] * 7) == 7
    assert metrics.peak_concurrency([]) == 0


def test_metrics_reject_a_zero_duration():
    with pytest.raises(ValueError):
        metrics.compute_metrics([], 0.0)


def test_peer_e2e_includes_the_wait_for_earlier_batches():
    batches = [
        PeerBatch(prompt_lens=(10, 20), output_lens=(4, 8), generated_per_row=8, end_s=2.0),
        PeerBatch(prompt_lens=(30,), output_lens=(6,), generated_per_row=6, end_s=5.0),
    ]
    p = metrics.compute_peer_metrics(batches, batch_size=2)
    assert (p.completed, p.duration_s) == (3, 5.0)
    assert (p.total_input_tokens, p.total_output_tokens, p.generated_tokens) == (60, 18, 22)
    assert p.output_throughput == pytest.approx(18 / 5)
    assert p.request_throughput == pytest.approx(3 / 5)
    assert p.e2e.mean_ms == pytest.approx(3000.0)  # (2 + 2 + 5) / 3 s
    assert p.e2e.median_ms == pytest.approx(2000.0)


def test_batches_follow_arrival_order_with_a_smaller_last_one():
    assert metrics.plan_batches(5, 2) == [range(0, 2), range(2, 4), range(4, 5)]
    assert metrics.plan_batches(4, 16) == [range(0, 4)]


def test_peer_batch_size_matches_the_server_run_concurrency():
    small = [BenchRequest("p", 100, 100)] * 48
    assert peer.peer_batch_size(requested=0, max_concurrency=0, requests=small) == 48
    # 400 requests of 400 padded tokens: 163 rows fit one batch, so 3 equal batches of 134
    big = [BenchRequest("p", 200, 200)] * 400
    assert peer.peer_batch_size(requested=0, max_concurrency=0, requests=big) == 134
    assert peer.peer_batch_size(requested=0, max_concurrency=8) == 8
    assert peer.peer_batch_size(requested=4, max_concurrency=8) == 4


def test_ratios_are_sluice_over_peer():
    served = metrics.compute_metrics([_ok(e2e=1.0, ttft=0.1, tokens=10)], duration_s=1.0)
    batches = [PeerBatch((10,), (10,), 10, end_s=4.0)]
    ratios = metrics.compare(served, metrics.compute_peer_metrics(batches, 1))
    assert ratios["output_throughput_sluice_over_peer"] == pytest.approx(4.0)
    assert ratios["mean_e2e_sluice_over_peer"] == pytest.approx(0.25)


# --- SSE stream reading -------------------------------------------------------------------


def _chunk(text, finish=None):
    return "data: " + json.dumps(
        {
            "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}],
        }
    )


USAGE = "data: " + json.dumps(
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 12,
            "completion_tokens": 3,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }
)


def test_sse_lines_parse_to_events_done_or_nothing():
    assert client.parse_sse_line('data: {"a": 1}') == {"a": 1}
    assert client.parse_sse_line('data:{"a": 1}\n') == {"a": 1}
    assert client.parse_sse_line("data: [DONE]") == client.DONE
    for line in ["", "   ", ": keep-alive", "event: message", "id: 3"]:
        assert client.parse_sse_line(line) is None
    with pytest.raises(ValueError):
        client.parse_sse_line("data: {not json")


def _read(lines_at):
    reader = client.StreamReader(start=10.0)
    for line, at in lines_at:
        reader.feed(line, at)
    return reader.result(BenchRequest("p", 12, 3), end=11.0, send_time=0.25)


def test_stream_timings_count_text_chunks_and_take_tokens_from_usage():
    result = _read(
        [
            (_chunk(""), 10.1),  # an empty chunk is not a token
            (_chunk("Hel"), 10.5),
            ("", 10.5),
            (_chunk("lo"), 10.6),
            (_chunk(" you", "length"), 10.8),
            (USAGE, 10.9),
            ("data: [DONE]", 10.95),
        ]
    )
    assert result.success
    assert result.ttft == pytest.approx(0.5)
    assert result.itl == pytest.approx((0.1, 0.2))
    assert result.e2e == pytest.approx(1.0)
    assert (result.output_tokens, result.usage_reported) == (3, True)
    assert (result.server_prompt_tokens, result.cached_tokens) == (12, 4)
    assert result.text == "Hello you"
    assert result.tpot == pytest.approx(0.25)


def test_a_stream_without_usage_counts_text_chunks():
    result = _read([(_chunk("a"), 10.2), (_chunk("b"), 10.3), ("data: [DONE]", 10.4)])
    assert result.success
    assert (result.output_tokens, result.usage_reported) == (2, False)


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        ([(_chunk("a"), 10.2)], "without [DONE]"),
        ([('data: {"error": {"message": "boom", "code": 500}}', 10.2)], "boom"),
        ([("data: [DONE]", 10.2)], "no text chunk"),
        ([(_chunk("a"), 10.2), ("data: {oops", 10.3)], "bad SSE data"),
    ],
)
def test_broken_streams_are_failures_with_a_reason(lines, error):
    result = _read(lines)
    assert not result.success
    assert error in result.error


def test_payload_asks_for_greedy_streaming_with_usage_and_ignore_eos():
    config = client.LoadConfig(url="u", model="m", extra_body={"top_k": 1})
    body = client.build_payload(config, "hi", 7)
    assert body == {
        "model": "m",
        "prompt": "hi",
        "max_tokens": 7,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
        "top_k": 1,
    }
    off = client.LoadConfig(url="u", model="m", ignore_eos=False)
    assert client.build_payload(off, "hi", 7)["ignore_eos"] is False


def test_arrivals_are_all_at_once_at_rate_inf_and_poisson_otherwise():
    assert client.arrival_offsets(4, math.inf, seed=1) == [0.0] * 4
    offsets = client.arrival_offsets(4000, 8.0, seed=1)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert np.mean(np.diff(offsets)) == pytest.approx(1 / 8, rel=0.05)
    assert client.arrival_offsets(50, 8.0, seed=1) == client.arrival_offsets(50, 8.0, seed=1)


def _fake_server(in_flight, peak):
    """An in-process OpenAI completions endpoint that streams `max_tokens` one-letter chunks
    and records how many requests it was serving at once (up to each stream's last event)."""

    async def handler(request: httpx.Request) -> httpx.Response:
        tokens = json.loads(request.content)["max_tokens"]
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}

        async def stream():
            for _ in range(tokens):
                await asyncio.sleep(0.002)
                yield (_chunk("x") + "\n\n").encode()
            in_flight[0] -= 1
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()

        return httpx.Response(200, content=stream())

    return httpx.MockTransport(handler)


def test_load_keeps_request_order_and_the_concurrency_cap():
    in_flight, peak = [0], [0]
    requests = [BenchRequest(f"p{i}", 5, 2 + i % 3) for i in range(12)]
    config = client.LoadConfig(url="http://bench/v1/completions", model="m", max_concurrency=3)
    results, duration = asyncio.run(
        client.run_load(config, requests, progress=False, transport=_fake_server(in_flight, peak))
    )
    assert peak[0] == 3
    assert [r.output_tokens for r in results] == [r.output_len for r in requests]
    assert all(r.success for r in results)
    m = metrics.compute_metrics(results, duration)
    assert m.peak_concurrency <= 3 and m.output_len_mismatches == 0


def test_an_http_error_is_a_failed_request():
    transport = httpx.MockTransport(lambda _: httpx.Response(400, json={"error": {"message": "x"}}))
    config = client.LoadConfig(url="http://bench/v1/completions", model="m")
    results, _ = asyncio.run(
        client.run_load(config, [BenchRequest("p", 1, 1)], progress=False, transport=transport)
    )
    assert not results[0].success and results[0].error.startswith("HTTP 400")


# --- command line and report --------------------------------------------------------------


def test_cli_defaults_are_the_closing_note_run_with_the_peer_on():
    args = BenchArgs.from_cli([])
    assert (args.num_prompts, args.random_input_len, args.random_output_len) == (64, 512, 256)
    assert args.random_range_ratio == 0.25 and args.peer == "hf"
    assert math.isinf(args.request_rate) and args.max_concurrency == 0
    assert args.base_url == "http://127.0.0.1:30000"


def test_no_peer_turns_the_peer_off():
    assert BenchArgs.from_cli(["--no-peer"]).peer == "none"


@pytest.mark.parametrize(
    "argv", [["--random-range-ratio", "2"], ["--request-rate", "0"], ["--extra-request-body", "[]"]]
)
def test_bad_flags_are_rejected(argv, capsys):
    with pytest.raises(SystemExit):
        BenchArgs.from_cli(argv)
    assert "error" in capsys.readouterr().err


def test_result_document_is_strict_json():
    served = metrics.compute_metrics([_ok(e2e=1.0, ttft=0.1, tokens=10)], duration_s=1.0)
    summary = dataset.DatasetSummary.of([BenchRequest("p", 10, 10)])
    config = BenchArgs.from_cli([]).to_dict()
    doc = report.result_document(config, summary, served, None, None, None, None, ["n"])
    text = json.dumps(doc, allow_nan=False)
    assert json.loads(text)["config"]["request_rate"] == "inf"
    assert json.loads(text)["sluice"]["mean_ttft_ms"] == pytest.approx(100.0)
    assert json.loads(text)["sluice"]["mean_e2e_latency_ms"] == pytest.approx(1000.0)
    assert "api_key" not in doc["config"]


# --- the transformers peer on a tiny random model -------------------------------------------


def test_peer_generates_each_batch_for_its_longest_request(word_tokenizer, tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(word_tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        eos_token_id=word_tokenizer.eos_token_id,
        pad_token_id=word_tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    word_tokenizer.save_pretrained(tmp_path)
    requests = dataset.sample_random_requests(word_tokenizer, 3, 12, 6, 0.5, seed=0)

    batches = peer.run_hf_peer(tmp_path, requests, batch_size=2, threads=1, log=lambda _: None)

    assert [b.output_lens for b in batches] == [
        tuple(r.output_len for r in requests[:2]),
        (requests[2].output_len,),
    ]
    assert [b.generated_per_row for b in batches] == [max(b.output_lens) for b in batches]
    assert 0 < batches[0].end_s <= batches[1].end_s


# --- --launch-server's process handling, with a stand-in HTTP process -----------------------

STAND_IN = textwrap.dedent(
    """
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_takes_host_and_port_from_the_base_url():
    command = server.serve_command("smollm2-135m", "http://127.0.0.1:31000", "--page-size 16")
    assert command[1:] == [
        "-m",
        "sluice.runtime",
        "serve",
        "--model",
        "smollm2-135m",
        "--host",
        "127.0.0.1",
        "--port",
        "31000",
        "--page-size",
        "16",
    ]


def test_a_launched_server_is_healthy_inside_the_block_and_gone_after(tmp_path):
    port = _free_port()
    command = [sys.executable, "-c", STAND_IN, str(port)]
    url = f"http://127.0.0.1:{port}"
    with server.launched_server(command, url, 30, log_path=tmp_path / "log") as s:
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        assert s.peak_rss_mib() > 0
    assert s.process.returncode is not None


def test_a_server_that_exits_early_is_reported_with_its_code_and_log(tmp_path):
    command = [sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"]
    url = f"http://127.0.0.1:{_free_port()}"
    with pytest.raises(RuntimeError, match="(?s)code 3.*no model here"):
        with server.launched_server(command, url, 30, log_path=tmp_path / "log"):
            pass


def test_the_warmup_prompt_shares_no_prefix_with_the_dataset(word_tokenizer):
    requests = dataset.sample_random_requests(word_tokenizer, 20, 40, 8, 0.5, seed=5)
    warm = dataset.warmup_request(word_tokenizer, seed=5)
    warm_ids = _encode(word_tokenizer, warm.prompt)
    assert warm.prompt_len == len(warm_ids) == 32
    for r in requests:
        assert dataset.common_prefix_len(warm_ids, _encode(word_tokenizer, r.prompt)) < 2


# --- the CPU run's additions: peers, length bounds, GEMM ceilings ---------------------------


def test_hf_means_both_transformers_peers_and_names_are_checked(capsys):
    assert BenchArgs.from_cli([]).peer_names() == ["hf-fp32", "hf-bf16"]
    assert not BenchArgs.from_cli([]).no_gemm_ceiling  # the ceilings are measured by default
    assert BenchArgs.from_cli(["--peer", "hf-bf16,llamacpp"]).peer_names() == ["hf-bf16", "llamacpp"]
    assert BenchArgs.from_cli(["--no-peer"]).peer_names() == []
    with pytest.raises(SystemExit):
        BenchArgs.from_cli(["--peer", "vllm"])
    assert "unknown peer" in capsys.readouterr().err


def test_explicit_minimum_lengths_bound_the_draws(word_tokenizer):
    requests = dataset.sample_random_requests(
        word_tokenizer, 200, 40, 224, 0.25, seed=3, input_min=20, output_min=32
    )
    outs = [r.output_len for r in requests]
    assert min(outs) >= 32 and max(outs) <= 224 and min(outs) < 60 and max(outs) > 190
    assert all(20 <= r.prompt_len <= 40 for r in requests)


def test_model_flops_split_decoder_and_lm_head_from_the_weights():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.serving.ceiling import model_flops

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         tie_word_embeddings=True)  # fmt: skip
    model = LlamaForCausalLM(config)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    flops = model_flops(config.to_dict())
    assert flops.lm_head == 2 * 64 * 300
    assert flops.decoder + flops.lm_head == 2 * weights


def test_prompt_tokens_are_not_credited_with_lm_head_flops():
    from benchmarks.serving.ceiling import Ceiling, ModelFlops

    flops = ModelFlops(decoder=100.0, lm_head=50.0)
    ceilings = [Ceiling("float32", 1e-6, 1e3 / 150, flops), Ceiling("bfloat16", 4e-6, 4e3 / 150, flops)]
    # 30 tok/s in all, 10 of them generated: 30 x 100 + 10 x 50 = 3500 FLOP/s, not 30 x 150
    assert ceilings[0].fraction(30.0, 10.0) == pytest.approx(3500 / 1000)
    assert ceilings[1].fraction(30.0, 10.0) == pytest.approx(3500 / 4000)
    text = report.format_ceilings(ceilings, 30.0, 10.0)
    assert "350.0%" in text and "87.5%" in text and "bfloat16 GFLOP/s" in text


def test_comparisons_show_every_peer_and_the_best():
    ratios = {
        "hf-fp32": {"output_throughput_sluice_over_peer": 4.0, "mean_e2e_sluice_over_peer": 0.3},
        "hf-bf16": {"output_throughput_sluice_over_peer": 2.5, "mean_e2e_sluice_over_peer": 0.5},
    }
    text = report.format_comparisons(ratios)
    assert "Sluice / hf-fp32:" in text and "4x" in text
    assert text.count("Sluice / best peer:") == 1 and "2.5x" in text.split("best peer:")[1]


def test_launching_onto_a_port_in_use_is_refused(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        url = f"http://127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(RuntimeError, match="already in use"):
            with server.launched_server([sys.executable, "-c", "pass"], url, 5, log_path=tmp_path / "l"):
                pass


def test_model_flops_of_a_mixture_of_experts_count_the_experts_a_token_uses():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from benchmarks.serving.ceiling import model_flops

    config = Qwen3MoeConfig(vocab_size=300, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                            num_experts=8, num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)  # fmt: skip
    model = Qwen3MoeForCausalLM(config)
    matrices = {n: p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and "embed" not in n}
    experts = sum(v for n, v in matrices.items() if ".experts." in n)
    # what one token multiplies: every matrix but the experts it did not pick
    used = sum(matrices.values()) - experts + experts * config.num_experts_per_tok // config.num_experts
    flops = model_flops(config.to_dict())
    assert flops.decoder == 2 * used
    assert flops.lm_head == 2 * 64 * 300


def test_long_short_mixes_long_prompts_with_short_answers_and_the_reverse(word_tokenizer):
    requests = dataset.sample_long_short_requests(
        word_tokenizer, 400, input_len=200, output_len=300, range_ratio=0.25, seed=2,
        input_min=40, output_min=20, long_fraction=0.25,
    )  # fmt: skip
    long = [r for r in requests if r.prompt_len > 40]
    short = [r for r in requests if r.prompt_len <= 40]
    assert 0.18 < len(long) / len(requests) < 0.32
    assert all(50 <= r.prompt_len <= 200 and 5 <= r.output_len <= 20 for r in long)
    assert all(10 <= r.prompt_len <= 40 and 75 <= r.output_len <= 300 for r in short)
    again = dataset.sample_long_short_requests(
        word_tokenizer, 400, input_len=200, output_len=300, range_ratio=0.25, seed=2,
        input_min=40, output_min=20, long_fraction=0.25,
    )  # fmt: skip
    assert again == requests
    with pytest.raises(ValueError, match="long-short"):
        dataset.sample_long_short_requests(word_tokenizer, 4, 200, 300, 0.25, seed=2)
