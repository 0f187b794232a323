"""One MoE layer on the CPU: grouped expert GEMMs vs the per-expert loop vs transformers.

    python -m benchmarks.cpu.moe [--dtype bfloat16] [--threads 1 --clock cpu] [--tokens 1 16 128 512]

Shapes: tiny but wide, Qwen3-30B-A3B's routing (128 experts, top-8) on a 1024-wide model
with experts 256 wide (weights on one layer: 128 x 3 x 1024 x 256). For each batch size
(tokens), ms per layer call of: our `grouped` (two `torch._grouped_mm` over the tokens sorted
by expert), `segments` (one GEMM per expert that received tokens), `loop` (every expert masks
every token, the naive per-expert loop), and transformers' own `Qwen3MoeSparseMoeBlock` on
the same weights; all from the same run, so the ratios hold on a busy machine too.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from sluice.runtime.model.config import MoEOptions
from sluice.runtime.model.moe import MoE

HIDDEN, WIDTH, EXPERTS, TOP_K = 1024, 256, 128, 8


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_call(fn: Callable[[], object], min_seconds: float = 0.5, clock: str = "wall") -> float:
    """Mean ms per call over at least `min_seconds` (and 5 calls), after one warm-up; `cpu`:
    the process's CPU time (with one thread, robust to other load on a shared machine)."""
    now = CLOCKS[clock]
    fn()
    runs, start = 0, now()
    while now() - start < min_seconds or runs < 5:
        fn()
        runs += 1
    return (now() - start) / runs * 1e3


def build(dtype: torch.dtype) -> tuple[MoE, torch.nn.Module]:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    options = MoEOptions(EXPERTS, TOP_K, WIDTH, renormalize=True, sparse_layers=(0,))
    ours = MoE(HIDDEN, options, "cpu", dtype)
    gen = torch.Generator().manual_seed(0)
    for param in (ours.gate.weight, ours.w13, ours.w2):
        param.data.copy_(0.05 * torch.randn(param.shape, generator=gen))
    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=WIDTH, num_experts=EXPERTS,
                            num_experts_per_tok=TOP_K, norm_topk_prob=True)  # fmt: skip
    theirs = Qwen3MoeSparseMoeBlock(config).to(dtype).eval()
    with torch.no_grad():
        theirs.gate.weight.copy_(ours.gate.weight)
        theirs.experts.gate_up_proj.copy_(ours.w13)
        theirs.experts.down_proj.copy_(ours.w2)
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 16, 128, 512])
    parser.add_argument("--seconds", type=float, default=0.5, help="minimum time per measurement")
    parser.add_argument("--clock", default="wall", choices=list(CLOCKS), help="cpu: CPU time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    ours, theirs = build(dtype)
    rows = []
    with torch.inference_mode():
        for tokens in args.tokens:
            x = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)).to(
                dtype
            )
            row: dict[str, float | int] = {"tokens": tokens}
            for impl in ("grouped", "segments", "loop"):
                ours.impl = impl
                row[impl] = time_call(lambda x=x: ours(x), args.seconds, args.clock)
            row["transformers"] = time_call(
                lambda x=x: theirs(x.unsqueeze(0)), args.seconds, args.clock
            )
            ours.impl = "grouped"
            reference = theirs(x.unsqueeze(0))
            reference = reference[0] if isinstance(reference, tuple) else reference
            row["max_abs_diff_vs_transformers"] = (ours(x) - reference[0]).abs().max().item()
            rows.append(row)
            print(
                f"tokens {tokens:4d}: grouped {row['grouped']:8.2f} ms  segments "
                f"{row['segments']:8.2f} ms  loop {row['loop']:8.2f} ms  transformers "
                f"{row['transformers']:8.2f} ms  (loop/grouped {row['loop'] / row['grouped']:.1f}x, "
                f"transformers/grouped {row['transformers'] / row['grouped']:.1f}x)",
                flush=True,
            )
    print(json.dumps({"dtype": args.dtype, "clock": args.clock, "threads": torch.get_num_threads(), "shape": {
        "hidden": HIDDEN, "expert_width": WIDTH, "experts": EXPERTS, "top_k": TOP_K}, "rows": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
