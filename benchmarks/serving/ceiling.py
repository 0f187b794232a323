"""GEMM ceilings: how many tokens per second the machine's matmuls allow at best.

The issue's yardstick: GFLOP/s of a `[256×576]·[576×1536]` matmul (SmolLM2-135M's MLP
shape at 256 rows) in fp32, bf16 and int8 (`torch._int_mm`, what w8a8 runs), measured in
the benchmark's own process right after the server run. A serving run's useful FLOP rate
over that GEMM rate is the fraction of the machine's matmul speed it turned into tokens.

Useful FLOPs (attention's own are left out): every token, prompt or output, multiplies the
decoder layers' projections (2 × their weights); only the tokens that come out also run the
output projection (one LM head per generated token: a prompt's positions before its last
never reach it). `tokens_per_s` is the ceiling in generated-token terms (decoder + LM head).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

GEMM_SHAPE = (256, 576, 1536)  # M, K, N
DTYPES = ("float32", "bfloat16", "int8")


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per token of the decoder layers and of the output projection."""

    decoder: float
    lm_head: float

    @property
    def per_generated_token(self) -> float:
        return self.decoder + self.lm_head

    def rate(self, total_tokens_per_s: float, output_tokens_per_s: float) -> float:
        """Useful FLOP/s of a run: every token through the decoder, output tokens through
        the LM head too."""
        return total_tokens_per_s * self.decoder + output_tokens_per_s * self.lm_head


@dataclass(frozen=True)
class Ceiling:
    dtype: str
    gflops: float  # GFLOP/s (GOP/s for int8) of the GEMM
    tokens_per_s: float  # gflops / the FLOPs of one generated token (decoder + LM head)
    flops: ModelFlops

    def fraction(self, total_tokens_per_s: float, output_tokens_per_s: float) -> float:
        """The run's useful FLOP rate over this GEMM rate."""
        if self.gflops <= 0:
            return 0.0
        return self.flops.rate(total_tokens_per_s, output_tokens_per_s) / (self.gflops * 1e9)


def model_flops(config: dict) -> ModelFlops:
    """2 × the weights one token multiplies, split decoder / LM head (Llama family
    config.json; a mixture of experts multiplies its `top_k` experts' weights, of
    `moe_intermediate_size` (Qwen3-MoE) or `intermediate_size` (Mixtral, gpt-oss) each, and
    its router's)."""
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    per_layer = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    if experts:
        top_k = config.get("num_experts_per_tok") or config.get("experts_per_token") or 1
        inter = config.get("moe_intermediate_size") or config["intermediate_size"]
        per_layer += top_k * 3 * hidden * inter + hidden * experts
    else:
        per_layer += 3 * hidden * config["intermediate_size"]
    return ModelFlops(2.0 * config["num_hidden_layers"] * per_layer,
                      2.0 * hidden * config["vocab_size"])  # fmt: skip


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
    flops = model_flops(json.loads((Path(model_path) / "config.json").read_text()))
    out = []
    for dtype in DTYPES:
        g = gemm_gflops(dtype)
        out.append(Ceiling(dtype, g, g * 1e9 / flops.per_generated_token, flops))
    return out


def to_dicts(ceilings: list[Ceiling]) -> list[dict]:
    return [asdict(c) for c in ceilings]
