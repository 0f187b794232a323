"""GPU defaults sized from the GPU's memory (SGLang's rules), with a stated memory figure
in place of a device; the CPU keeps its fixed sizes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sluice.runtime.engine.gpu_defaults import (
    memory_defaults,
    resolve_gpu_defaults,
    running_requests,
)
from sluice.runtime.server_args import ServerArgs

GIB = 2**30
H200 = 143771 * 2**20  # what nvidia-smi reports for the H200
LLAMA_8B_KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16


@pytest.mark.parametrize(
    ("gib", "chunk", "graph_bs"),
    [(16, 2048, 8), (24, 2048, 24), (48, 4096, 32), (80, 8192, 256), (140.4, 8192, 256), (192, 16384, 512)],
)
def test_chunk_and_graph_batch_follow_sglangs_memory_table(gib, chunk, graph_bs):
    sized = memory_defaults(int(gib * GIB))
    assert (sized.chunked_prefill_size, sized.cuda_graph_max_bs) == (chunk, graph_bs)


def test_four_or_more_ranks_capture_larger_graph_batches():
    assert memory_defaults(H200, tp_size=4).cuda_graph_max_bs == 512
    assert memory_defaults(24 * GIB, tp_size=8).cuda_graph_max_bs == 80


def test_running_requests_follow_the_kv_pool_between_2048_and_4096():
    assert running_requests(800_000, 4096) == 4096
    assert running_requests(100_000, 131072) == 2048
    assert running_requests(600_000, 131072) == int(600_000 / 131072 * 512)  # 2343


def test_an_h200_serving_an_8b_model_gets_a_8192_chunk_256_graph_batches_and_4096_slots(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)  # the weights' size is read
    args = ServerArgs(model=str(tmp_path), device="cuda", max_context_len=4096)
    assert (args.max_running_requests, args.chunked_prefill_size, args.cuda_graph_max_bs) == (0, 0, 0)
    done = resolve_gpu_defaults(args, H200, tmp_path, LLAMA_8B_KV_PER_TOKEN, 4096)
    assert (done.chunked_prefill_size, done.cuda_graph_max_bs, done.max_running_requests) == (8192, 256, 4096)


def test_explicit_flags_are_kept_and_the_weights_shrink_the_pool(tmp_path: Path):
    args = ServerArgs(model=str(tmp_path), device="cuda", chunked_prefill_size=1024, cuda_graph_max_bs=64)
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    small = dataclasses.replace(args, mem_fraction_static=0.05)
    done = resolve_gpu_defaults(small, 24 * GIB, tmp_path, LLAMA_8B_KV_PER_TOKEN, 131072)
    assert (done.chunked_prefill_size, done.cuda_graph_max_bs) == (1024, 64)
    assert done.max_running_requests == 2048  # a small pool: the floor


def test_the_cpu_keeps_its_fixed_sizes():
    args = ServerArgs(device="cpu")
    assert (args.max_running_requests, args.chunked_prefill_size, args.cuda_graph_max_bs) == (64, 2048, 160)
    assert ServerArgs(device="cpu", max_running_requests=8).max_running_requests == 8
    assert json.dumps(dataclasses.asdict(args))  # still plain data
