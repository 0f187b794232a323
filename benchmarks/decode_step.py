"""Decode step time per batch size, eager and through captured CUDA graphs (GPU).

For each batch bucket, every request has `--context-len` tokens of KV (random slots of a
pool big enough for all of them); one decode step is timed with CUDA events, the mean of
`--iters` steps after `--warmup`. Writes a JSON document and prints a table.

    python -m benchmarks.decode_step --model /path/to/folder --backend flashinfer \
        --batch-sizes 1,8,32,64,128,160 --output-file decode.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sluice.runtime.attention.registry import create_attention_backend  # noqa: E402
from sluice.runtime.engine.cuda_graph import CudaGraphRunner, capture_batch_sizes  # noqa: E402
from sluice.runtime.forward import ForwardBatch, ForwardMode  # noqa: E402
from sluice.runtime.memory.kv_buffers import KVBuffers  # noqa: E402
from sluice.runtime.model.loader import load_model  # noqa: E402


def decode_batch(bs: int, context: int, table: torch.Tensor, kv: KVBuffers) -> ForwardBatch:
    """Requests in rows 0..bs-1 with `context` cached tokens each (rows are pre-filled)."""
    device = table.device
    seq = [context + 1] * bs
    rows = torch.arange(bs, device=device)
    return ForwardBatch(
        mode=ForwardMode.DECODE,
        input_ids=torch.randint(0, 1000, (bs,), device=device),
        positions=torch.full((bs,), context, device=device),
        out_cache_loc=table[:bs, context].to(torch.int64),
        req_pool_indices=rows,
        seq_lens=torch.tensor(seq, device=device),
        prefix_lens=torch.full((bs,), context, device=device),
        extend_lens=torch.ones(bs, dtype=torch.int64, device=device),
        seq_lens_cpu=seq,
        prefix_lens_cpu=[context] * bs,
        extend_lens_cpu=[1] * bs,
        req_to_token=table,
        kv=kv,
    )


def time_steps(step, warmup: int, iters: int) -> float:
    """Mean milliseconds of `step()` on the GPU."""
    for _ in range(warmup):
        step()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder")
    parser.add_argument("--backend", default="auto", help="attention backend")
    parser.add_argument("--batch-sizes", default="1,8,32,64,128,160")
    parser.add_argument("--context-len", type=int, default=512)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--output-file", default="")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    device, dtype = "cuda", torch.bfloat16
    backend = create_attention_backend(args.backend, device, page_size=args.page_size)
    model, config = load_model(Path(args.model), device, dtype, backend)
    max_bs, ctx = max(sizes), args.context_len
    per_req = -(-(ctx + 1) // args.page_size) * args.page_size
    slots = args.page_size + max_bs * per_req
    kv = KVBuffers(slots, config.num_hidden_layers, config.num_key_value_heads,
                   config.head_dim, dtype, device)  # fmt: skip
    for layer in range(config.num_hidden_layers):
        kv.k[layer].normal_()
        kv.v[layer].normal_()
    # each request's tokens on its own slots (page-aligned runs), page 0 left reserved
    table = torch.zeros(max_bs, ctx + 1, dtype=torch.int32, device=device)
    for r in range(max_bs):
        base = args.page_size + r * per_req
        table[r] = torch.arange(base, base + ctx + 1, dtype=torch.int32, device=device)
    buckets = capture_batch_sizes(max_bs, max_bs)
    runner = CudaGraphRunner(model, [b for b in buckets if b in sizes] or buckets)
    runner.capture(table, kv)
    rows = []
    with torch.inference_mode():
        for bs in sizes:
            batch = decode_batch(bs, ctx, table, kv)
            eager = time_steps(lambda b=batch: model.forward(b), args.warmup, args.iters)
            graph = time_steps(lambda b=batch: runner.replay(b), args.warmup, args.iters)
            rows.append({"batch_size": bs, "eager_ms": eager, "graph_ms": graph,
                         "speedup": eager / graph, "graph_tok_s": bs * 1000 / graph})  # fmt: skip
    name = type(backend).__name__
    print(f"decode step, {name}, context {ctx}, page size {args.page_size}, bf16 "
          f"(graphs captured in {runner.capture_seconds:.1f} s, {runner.capture_bytes / 2**20:.0f} MiB)")  # fmt: skip
    print(f"{'batch':>6} {'eager ms':>9} {'graph ms':>9} {'speedup':>8} {'tok/s (graph)':>14}")
    for r in rows:
        print(f"{r['batch_size']:>6} {r['eager_ms']:>9.3f} {r['graph_ms']:>9.3f} "
              f"{r['speedup']:>7.2f}x {r['graph_tok_s']:>14.0f}")  # fmt: skip
    if args.output_file:
        doc = {"backend": name, "context_len": ctx, "page_size": args.page_size, "dtype": "bf16",
               "capture_seconds": runner.capture_seconds, "capture_bytes": runner.capture_bytes,
               "gpu": torch.cuda.get_device_name(), "steps": rows}  # fmt: skip
        Path(args.output_file).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
