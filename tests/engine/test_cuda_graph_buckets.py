"""Decode CUDA graphs without a GPU: the buckets, when graphs are off, and that a batch
padded to its bucket (what a replay computes) gives the unpadded batch's logits."""

from __future__ import annotations

import pytest
import torch
from paged_model import PagedSession

from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.engine.cuda_graph import (
    PAD_SLOT,
    DecodeGraphInputs,
    bucket_for,
    capture_batch_sizes,
    cuda_graph_disabled_reason,
)
from sluice.runtime.engine.worker_setup import gpu_kv_pool_tokens
from sluice.runtime.forward import ForwardBatch
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.model.loader import load_model


def test_buckets_follow_1_2_4_8_then_steps_of_8_up_to_the_cap():
    assert capture_batch_sizes(160, 256) == [1, 2, 4, 8, *range(16, 161, 8)]
    assert capture_batch_sizes(160, 64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_batch_sizes(160, 50) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 50]
    assert capture_batch_sizes(5, 64) == [1, 2, 4, 5]
    assert capture_batch_sizes(1, 64) == [1]


def test_each_batch_size_gets_the_smallest_bucket_that_holds_it():
    sizes = capture_batch_sizes(160, 50)
    assert [bucket_for(n, sizes) for n in (1, 2, 3, 5, 8, 9, 17, 49, 50)] == [
        1, 2, 4, 8, 8, 16, 24, 50, 50,
    ]  # fmt: skip
    assert bucket_for(51, sizes) is None and bucket_for(0, sizes) is None


def test_graphs_are_off_where_they_cannot_run():
    torch_backend = TorchAttentionBackend()

    class Capturable(TorchAttentionBackend):
        supports_cuda_graph = True

    assert cuda_graph_disabled_reason("cuda", Capturable(), True, False) == "--disable-cuda-graph"
    assert cuda_graph_disabled_reason("cpu", Capturable(), False, False) == "the device is cpu"
    assert "deterministic" in cuda_graph_disabled_reason("cuda", Capturable(), False, True)
    assert "cannot be captured" in cuda_graph_disabled_reason("cuda", torch_backend, False, False)
    assert cuda_graph_disabled_reason("cuda:0", Capturable(), False, False) is None


def test_gpu_pool_takes_the_fraction_minus_what_is_in_use():
    gib = 2**30
    # 80 GiB card, 2 GiB in use (weights, context, workspace): 0.85 * 80 - 2 = 66 GiB of KV
    assert gpu_kv_pool_tokens(80 * gib, 78 * gib, 0.85, 1024) == 66 * gib // 1024
    with pytest.raises(RuntimeError, match="--mem-fraction-static 0.1 leaves no room"):
        gpu_kv_pool_tokens(80 * gib, 70 * gib, 0.1, 1024)


@pytest.fixture(scope="module")
def triton_model(tiny_llama_path):
    pytest.importorskip("triton")  # under the interpreter (tests/conftest.py)
    from sluice.runtime.attention.triton.backend import TritonAttentionBackend

    model, config = load_model(tiny_llama_path, "cpu", torch.float32, TritonAttentionBackend())
    return model, config


def _decode_batch(model, prompts: list[list[int]], page_size: int) -> ForwardBatch:
    """Prefill `prompts`, then the decode batch of their next tokens (not yet run)."""
    session = PagedSession(model, page_size=page_size, max_total_tokens=512, max_context=64)
    reqs, logits = session.prefill(prompts)
    return session.decode_batch(reqs, logits.argmax(-1).tolist())


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_batch_padded_to_its_bucket_gives_the_same_logits(triton_model, page_size):
    model, _ = triton_model
    decode = _decode_batch(model, [[5, 6, 7, 8, 9], [10, 11], [12] * 20], page_size)
    kv_before = [t.clone() for t in decode.kv.k]
    eager = model.forward(decode)
    after_eager = [t.clone() for t in decode.kv.k]

    inputs = DecodeGraphInputs(max_bs=8, device="cpu")
    padded = inputs.load(decode, bucket=4)
    assert padded.batch_size == 4 and padded.seq_lens_cpu == [*decode.seq_lens_cpu, 1]
    assert padded.out_cache_loc.tolist() == [*decode.out_cache_loc.tolist(), PAD_SLOT]
    replayed = model.forward(padded)

    torch.testing.assert_close(replayed[:3], eager, atol=1e-5, rtol=1e-5)
    for before, eager_k, padded_k in zip(kv_before, after_eager, decode.kv.k, strict=True):
        # the padding row wrote its K/V to reserved slot 0 and nowhere else
        torch.testing.assert_close(padded_k[1:], eager_k[1:], atol=1e-6, rtol=0)
        assert not torch.equal(eager_k[decode.out_cache_loc], before[decode.out_cache_loc])


def test_a_batch_larger_than_its_bucket_is_refused():
    inputs = DecodeGraphInputs(max_bs=4, device="cpu")
    table = torch.zeros(2, 4, dtype=torch.int32)
    kv = KVBuffers(8, 1, 1, 4, torch.float32, "cpu")
    batch = inputs.view(inputs.template(table, kv), 4, [1, 1, 1, 1])
    with pytest.raises(ValueError, match="does not fit bucket 2"):
        inputs.load(batch, bucket=2)


def test_cuda_graph_flags_parse_and_a_bad_max_bs_is_refused(capsys):
    from sluice.runtime.cli import build_parser, main
    from sluice.runtime.server_args import ServerArgs

    args = ServerArgs.from_cli_args(build_parser().parse_args(["serve"]))
    assert args.cuda_graph_max_bs == 160 and not args.disable_cuda_graph
    flags = ["serve", "--disable-cuda-graph", "--cuda-graph-max-bs", "32"]
    args = ServerArgs.from_cli_args(build_parser().parse_args(flags))
    assert args.disable_cuda_graph and args.cuda_graph_max_bs == 32
    assert main(["serve", "--cuda-graph-max-bs", "-1"]) == 2
    assert "--cuda-graph-max-bs must be >= 1 (0: auto)" in capsys.readouterr().err
