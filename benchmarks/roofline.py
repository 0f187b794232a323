"""Decode and prefill against the GPU's own roofline (GPU only; scripts/gpu_check.sh runs it).

Measured in the same run:
- the HBM bandwidth: a large device-to-device copy (bytes read + written per second);
- the dense bf16 matmul rate: an 8192^3 bf16 product.

Then, for each attention backend (`--backends`), with CUDA graphs on and off:
- decode step time at each `--batch-sizes` with `--context-len` tokens of KV per request,
  against the memory roofline: (weight bytes read + KV bytes read) / HBM bandwidth, as a
  percentage (100% = the step moves its bytes at the measured bandwidth);
- prefill throughput (a batch of `--prefill-tokens` in prompts of `--prefill-len`) in
  TFLOP/s of the dense work (2 x non-embedding parameters x tokens, plus causal attention),
  as a percentage of the measured matmul rate.

    python -m benchmarks.roofline --model /tmp/llama8b-random --backends triton,flashinfer \
        --output-file roofline.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks.decode_step import decode_batch, time_steps  # noqa: E402
from sluice.runtime.attention.registry import create_attention_backend  # noqa: E402
from sluice.runtime.engine.cuda_graph import CudaGraphRunner  # noqa: E402
from sluice.runtime.forward import ForwardBatch, ForwardMode  # noqa: E402
from sluice.runtime.memory.kv_buffers import KVBuffers  # noqa: E402
from sluice.runtime.model.loader import load_model  # noqa: E402

BF16 = 2  # bytes


@dataclass(frozen=True)
class Shape:
    """What one step of the model reads, from its config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    params: int  # every parameter
    embedding: int  # embedding-table parameters (a decode step reads only its rows)
    tied: bool

    def weight_bytes(self) -> int:
        """Weights one decode step reads: all but the embedding table (unless tied: then
        the LM head reads it whole)."""
        read = self.params - (0 if self.tied else self.embedding)
        return read * BF16

    def kv_bytes(self, batch: int, context: int) -> int:
        return batch * context * self.layers * self.kv_heads * self.head_dim * 2 * BF16

    def dense_flops(self, tokens: int, prompt_lens: list[int]) -> float:
        matmul = 2.0 * (self.params - self.embedding) * tokens
        if self.tied:
            matmul += 2.0 * self.embedding * tokens
        # causal attention: QK^T and PV, half the square per prompt
        attn = sum(4.0 * self.layers * self.heads * self.head_dim * n * n / 2 for n in prompt_lens)
        return matmul + attn


def shape_of(model: torch.nn.Module, config: object) -> Shape:
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    embedding = model.embed_tokens.numel()
    return Shape(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                 config.num_key_value_heads, config.head_dim, params, embedding,
                 bool(config.tie_word_embeddings))  # fmt: skip


def hbm_bandwidth(gib: float = 4.0, iters: int = 10) -> float:
    """Bytes per second of a device-to-device copy (read + write counted)."""
    n = int(gib * 2**30) // BF16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = time_steps(lambda: dst.copy_(src), 3, iters)
    return 2 * n * BF16 / (ms / 1000)


def matmul_flops(size: int = 8192, iters: int = 10) -> float:
    a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    ms = time_steps(lambda: a @ b, 3, iters)
    return 2.0 * size**3 / (ms / 1000)


def prefill_batch(lens: list[int], table: torch.Tensor, kv: KVBuffers) -> ForwardBatch:
    device = table.device
    rows = list(range(len(lens)))
    return ForwardBatch(
        mode=ForwardMode.EXTEND,
        input_ids=torch.randint(0, 1000, (sum(lens),), device=device),
        positions=torch.cat([torch.arange(n, device=device) for n in lens]),
        out_cache_loc=torch.cat([table[r, :n] for r, n in zip(rows, lens, strict=True)]).to(torch.int64),
        req_pool_indices=torch.tensor(rows, device=device),
        seq_lens=torch.tensor(lens, device=device),
        prefix_lens=torch.zeros(len(lens), dtype=torch.int64, device=device),
        extend_lens=torch.tensor(lens, device=device),
        seq_lens_cpu=list(lens),
        prefix_lens_cpu=[0] * len(lens),
        extend_lens_cpu=list(lens),
        req_to_token=table,
        kv=kv,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model folder (bf16)")
    parser.add_argument("--backends", default="triton,flashinfer")
    parser.add_argument("--batch-sizes", default="1,16,64,160")
    parser.add_argument("--context-len", type=int, default=1024)
    parser.add_argument("--prefill-len", type=int, default=2048)
    parser.add_argument("--prefill-tokens", type=int, default=8192)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--output-file", default="")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("roofline: no CUDA device", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    backends = [b for b in args.backends.split(",") if b]
    bandwidth, flops = hbm_bandwidth(), matmul_flops()
    print(f"HBM {bandwidth / 1e12:.2f} TB/s (copy), bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    started = time.perf_counter()
    model, config = load_model(Path(args.model), "cuda", torch.bfloat16,
                               create_attention_backend(backends[0], "cuda"))  # fmt: skip
    shape = shape_of(model, config)
    print(f"model: {shape.params / 1e9:.2f} B parameters, {shape.layers} layers, loaded in "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    max_bs, ctx = max(sizes), args.context_len
    prompts = max(1, args.prefill_tokens // args.prefill_len)
    rows, width = max(max_bs, prompts), max(ctx + 1, args.prefill_len)
    kv = KVBuffers(1 + rows * width, shape.layers, shape.kv_heads, shape.head_dim,
                   torch.bfloat16, "cuda")  # fmt: skip
    for layer in range(shape.layers):
        kv.k[layer].normal_()
        kv.v[layer].normal_()
    table = (1 + torch.arange(rows * width, dtype=torch.int32, device="cuda")).view(rows, width)
    doc: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(), "hbm_bytes_per_s": bandwidth,
        "matmul_flops_per_s": flops, "params": shape.params, "weight_bytes": shape.weight_bytes(),
        "context_len": ctx, "decode": [], "prefill": [],
    }  # fmt: skip
    failures = []
    for name in backends:
        try:
            backend = create_attention_backend(name, "cuda")
        except Exception as err:  # noqa: BLE001  reported, and a failure of the run
            failures.append(f"{name}: {err}")
            print(f"{name}: unavailable: {err}")
            continue
        model.attn_backend = backend
        with torch.inference_mode():
            model.forward(decode_batch(1, ctx, table, kv))  # compile, learn the head shapes
            runner = CudaGraphRunner(model, sizes)
            runner.capture(table, kv)
            for bs in sizes:
                batch = decode_batch(bs, ctx, table, kv)
                eager = time_steps(lambda b=batch: model.forward(b), args.warmup, args.iters)
                graph = time_steps(lambda b=batch, r=runner: r.replay(b), args.warmup, args.iters)
                ideal_ms = (shape.weight_bytes() + shape.kv_bytes(bs, ctx + 1)) / bandwidth * 1000
                row = {"backend": name, "batch_size": bs, "eager_ms": eager, "graph_ms": graph,
                       "roofline_ms": ideal_ms, "graph_pct_of_roofline": 100 * ideal_ms / graph,
                       "eager_pct_of_roofline": 100 * ideal_ms / eager}  # fmt: skip
                doc["decode"].append(row)  # type: ignore[union-attr]
                print(f"decode {name:>10} bs {bs:>4}: eager {eager:7.3f} ms, graph {graph:7.3f} ms,"
                      f" roofline {ideal_ms:6.3f} ms -> {row['graph_pct_of_roofline']:5.1f}% (graph)"
                      f" {row['eager_pct_of_roofline']:5.1f}% (eager)")  # fmt: skip
            lens = [args.prefill_len] * prompts
            batch = prefill_batch(lens, table, kv)
            ms = time_steps(lambda b=batch: model.forward(b), 1, max(3, args.iters // 3))
            achieved = shape.dense_flops(sum(lens), lens) / (ms / 1000)
            row = {"backend": name, "tokens": sum(lens), "prompt_len": args.prefill_len, "ms": ms,
                   "tflops": achieved / 1e12, "pct_of_matmul": 100 * achieved / flops,
                   "tokens_per_s": sum(lens) / (ms / 1000)}  # fmt: skip
            doc["prefill"].append(row)  # type: ignore[union-attr]
            print(f"prefill {name:>9} {sum(lens)} tokens: {ms:.1f} ms, {row['tflops']:.0f} TFLOP/s,"
                  f" {row['pct_of_matmul']:.0f}% of the matmul rate, {row['tokens_per_s']:.0f} tok/s")  # fmt: skip
        torch.cuda.empty_cache()
    doc["failures"] = failures
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(doc, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
