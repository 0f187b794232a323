"""Decode attention alone: uniform vs skewed batches of the same total length, per backend.

    python -m benchmarks.cpu.attention [--dtype bfloat16] [--threads 2]

The skewed batch is one 2048-token request and 31 of 128 (6016 tokens); the uniform one is
32 requests of 188 (6016 tokens). SmolLM2-135M's attention shape: 9 query heads, 3 KV heads,
head_dim 64. Prints ms per layer call and every ratio, all from the same run.
"""

from __future__ import annotations

import argparse
import random
import time

import torch

from sluice.runtime.attention.cpu_backend import CpuAttentionBackend, VarlenTorchAttention
from sluice.runtime.attention.torch_backend import TorchAttentionBackend
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
BATCHES = {"uniform": [188] * 32, "skewed": [2048] + [128] * 31}


def decode_batch(lens: list[int], kv: KVBuffers, page: int, seed: int) -> ForwardBatch:
    """One decode token per request; pages scattered over the pool."""
    rng = random.Random(seed)
    pages = list(range(1, kv.num_slots // page))
    rng.shuffle(pages)
    table = torch.zeros(len(lens), max(lens) + page, dtype=torch.int32)
    locs = []
    for i, n in enumerate(lens):
        mine = [pages.pop() for _ in range(-(-n // page))]
        slots = [mine[p // page] * page + p % page for p in range(n)]
        table[i, :n] = torch.tensor(slots, dtype=torch.int32)
        locs.append(slots[-1])
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.zeros(len(lens), dtype=torch.int64),
        positions=torch.tensor([n - 1 for n in lens]),
        out_cache_loc=torch.tensor(locs),
        req_pool_indices=torch.arange(len(lens)),
        seq_lens=torch.tensor(lens),
        prefix_lens=torch.tensor([n - 1 for n in lens]),
        extend_lens=torch.ones(len(lens), dtype=torch.int64),
        seq_lens_cpu=list(lens),
        prefix_lens_cpu=[n - 1 for n in lens],
        extend_lens_cpu=[1] * len(lens),
        req_to_token=table,
        kv=kv,
    )


def time_call(fn, min_seconds: float = 0.5) -> float:
    fn()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_seconds or runs < 5:
        fn()
        runs += 1
    return (time.perf_counter() - start) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    kv = KVBuffers(16384, 1, KV_HEADS, HEAD_DIM, dtype, "cpu")
    kv.k[0].normal_()
    kv.v[0].normal_()
    backends = {
        "torch (padded gather)": TorchAttentionBackend(),
        "cpu kernels": CpuAttentionBackend(use_kernels=True),
        "cpu torch-varlen": VarlenTorchAttention(),
    }
    times: dict[tuple[str, str], float] = {}
    for shape, lens in BATCHES.items():
        batch = decode_batch(lens, kv, args.page_size, seed=1)
        q = torch.randn(len(lens), HEADS, HEAD_DIM).to(dtype)
        k = torch.randn(len(lens), KV_HEADS, HEAD_DIM).to(dtype)
        v = torch.randn(len(lens), KV_HEADS, HEAD_DIM).to(dtype)
        for name, backend in backends.items():
            backend.init_forward_metadata(batch)
            with torch.inference_mode():
                times[name, shape] = time_call(lambda b=backend, fb=batch, q=q, k=k, v=v: b.forward(q, k, v, 0, fb))
    print(f"decode attention, one layer, {args.dtype}, page {args.page_size}, "
          f"{torch.get_num_threads()} threads; {sum(BATCHES['uniform'])} tokens per batch")
    print(f"{'backend':<24}{'uniform ms':>12}{'skewed ms':>12}{'skewed/uniform':>16}")
    for name in backends:
        u, s = times[name, "uniform"], times[name, "skewed"]
        print(f"{name:<24}{u * 1e3:>12.3f}{s * 1e3:>12.3f}{s / u:>16.2f}")
    base = "cpu kernels"
    for name in backends:
        if name != base:
            print(f"{name} / cpu kernels: uniform {times[name, 'uniform'] / times[base, 'uniform']:.2f}x, "
                  f"skewed {times[name, 'skewed'] / times[base, 'skewed']:.2f}x")


if __name__ == "__main__":
    main()
