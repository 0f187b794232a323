"""GEMM ceilings: how many tokens per second the machine's matmuls allow at best.

The issue's yardstick: GFLOP/s of a `[256×576]·[576×1536]` matmul (SmolLM2-135M's MLP
shape at 256 rows) in fp32, bf16 and int8 (`torch._int_mm`, what w8a8 runs), measured in
the benchmark's own process right after the server run, divided by the model's FLOPs per
token (2 × the parameters every token multiplies: the decoder layers' projections and the
output projection; attention's own FLOPs are left out). A serving run's total token
throughput over a ceiling is the fraction of the machine's GEMM speed it turned into tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

GEMM_SHAPE = (256, 576, 1536)  # M, K, N
DTYPES = ("float32", "bfloat16", "int8")


@dataclass(frozen=True)
class Ceiling:
    dtype: str
    gflops: float  # GFLOP/s (GOP/s for int8) of the GEMM
    tokens_per_s: float  # gflops / the model's FLOPs per token

    def fraction(self, total_tokens_per_s: float) -> float:
        return total_tokens_per_s / self.tokens_per_s if self.tokens_per_s > 0 else 0.0


def model_flops_per_token(config: dict) -> float:
    """2 × the weights one token multiplies (Llama family config.json)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    per_layer += 3 * hidden * inter
    params = config["num_hidden_layers"] * per_layer + hidden * config["vocab_size"]
    return 2.0 * params


def gemm_gflops(dtype: str, seconds: float = 0.2, windows: int = 5) -> float:
    """The best of `windows` timing windows: a ceiling is what the machine can do, and other
    load on a shared machine only ever slows a window down."""
    import torch

    m, k, n = GEMM_SHAPE
    gen = torch.Generator().manual_seed(0)
    if dtype == "int8":
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=gen)
        b = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=gen).t()

        def op():
            return torch._int_mm(a, b)
    else:
        a = torch.randn(m, k, generator=gen).to(getattr(torch, dtype))
        b = torch.randn(n, k, generator=gen).to(getattr(torch, dtype))

        def op():
            return torch.nn.functional.linear(a, b)

    for _ in range(3):
        op()
    best = 0.0
    for _ in range(windows):
        runs, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds or runs < 5:
            op()
            runs += 1
        best = max(best, 2.0 * m * k * n * runs / elapsed / 1e9)
    return best


def measure_ceilings(model_path: Path, threads: int) -> list[Ceiling]:
    import torch

    torch.set_num_threads(threads)
    flops = model_flops_per_token(json.loads((Path(model_path) / "config.json").read_text()))
    out = []
    for dtype in DTYPES:
        g = gemm_gflops(dtype)
        out.append(Ceiling(dtype, g, g * 1e9 / flops))
    return out


def to_dicts(ceilings: list[Ceiling]) -> list[dict]:
    return [asdict(c) for c in ceilings]
