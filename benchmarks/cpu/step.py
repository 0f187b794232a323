"""Per-step model time on the CPU: prefill and decode, per configuration, in one process.

    python -m benchmarks.cpu.step [--batch-sizes 1,16,48] [--prompt-len 120] [--threads 1]
        [--configs fp32-torch,fp32-cpu,bf16-cpu,w8a8-cpu] [--profile]

Loads the bundled SmolLM2-135M (or --model-path), prefills `batch` prompts of
`--prompt-len` tokens in one extend batch, then times `--decode-steps` decode steps. It
prints ms per step, tokens/s, and each configuration's speed-up over the first one, all
measured in the same run; `--profile` adds a per-op-family breakdown of one decode step
(attention, GEMMs, the rest). Configurations: `<dtype>-<attention backend>`, with `w8a8`
(or `w8a16`) meaning bf16 plus that `--quantization`, and a `-fused` suffix for the compiled
RMSNorm/RoPE/SiLU ops (what the server runs on the CPU).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.constants import QUANTIZATIONS
from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.model import cpu_fused_ops
from sluice.runtime.model.loader import load_model, resolve_model_path
from sluice.runtime.model.quantization import quantize_model

# a quantization runs on bf16 activations
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16,
          **{q: torch.bfloat16 for q in QUANTIZATIONS if q != "none"}}  # fmt: skip


@dataclass
class Runner:
    """A contiguous KV layout per request (what the allocator hands out when idle)."""

    model: torch.nn.Module
    kv: KVBuffers
    table: torch.Tensor
    lens: list[int]

    @classmethod
    def create(cls, model, batch: int, context: int, kv_dtype: torch.dtype) -> Runner:
        c = getattr(model, "local_config", model.config)  # a tensor-parallel rank's KV heads
        kv = KVBuffers(batch * context + 1, c.num_hidden_layers, c.num_key_value_heads,
                       c.head_dim, kv_dtype, "cpu")  # fmt: skip
        table = (1 + torch.arange(batch * context, dtype=torch.int32)).view(batch, context)
        return cls(model, kv, table, [0] * batch)

    def forward(
        self, mode: ForwardMode, tokens: list[list[int]], all_logits: bool = False
    ) -> torch.Tensor:
        prefix = list(self.lens)
        extend = [len(t) for t in tokens]
        positions = [p for s, n in zip(prefix, extend, strict=True) for p in range(s, s + n)]
        locs = [int(self.table[i, p]) for i, (s, n) in enumerate(zip(prefix, extend, strict=True))
                for p in range(s, s + n)]  # fmt: skip
        seq = [s + n for s, n in zip(prefix, extend, strict=True)]
        self.lens = seq
        batch = ForwardBatch(
            mode=mode,
            input_ids=torch.tensor([t for ts in tokens for t in ts]),
            positions=torch.tensor(positions),
            out_cache_loc=torch.tensor(locs),
            req_pool_indices=torch.arange(len(tokens)),
            seq_lens=torch.tensor(seq),
            prefix_lens=torch.tensor(prefix),
            extend_lens=torch.tensor(extend),
            seq_lens_cpu=seq,
            prefix_lens_cpu=prefix,
            extend_lens_cpu=extend,
            req_to_token=self.table,
            kv=self.kv,
            return_all_logits=all_logits,
        )
        with torch.inference_mode():
            return self.model(batch)


def load(config: str, model_path: Path):
    """`<dtype>-<backend>[-fused]`: `-fused` turns on the compiled RMSNorm/RoPE/SiLU ops."""
    dtype_name, backend, *extra = config.split("-")
    model, _ = load_model(model_path, "cpu", DTYPES[dtype_name], backend)
    if dtype_name in QUANTIZATIONS:
        quantize_model(model, dtype_name)
    if "fused" in extra and (reason := cpu_fused_ops.enable(model)) is not None:
        raise SystemExit(f"fused ops unavailable: {reason}")
    return model, DTYPES[dtype_name]


def measure(model, kv_dtype, batch: int, prompt_len: int, steps: int, clock, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    prompts = torch.randint(10, vocab, (batch, prompt_len), generator=gen).tolist()
    runner = Runner.create(model, batch, prompt_len + steps + 2, kv_dtype)
    start = clock()
    logits = runner.forward(ForwardMode.EXTEND, prompts)
    prefill = clock() - start
    next_ids = logits.argmax(-1).tolist()
    runner.forward(ForwardMode.DECODE, [[t] for t in next_ids])  # first decode: warm
    start = clock()
    for _ in range(steps):
        logits = runner.forward(ForwardMode.DECODE, [[t] for t in next_ids])
        next_ids = logits.argmax(-1).tolist()
    decode = (clock() - start) / steps
    return prefill, decode, runner


def profile_decode(runner: Runner, batch: int) -> dict[str, float]:
    """Milliseconds per family of ops in one decode step (self CPU time)."""
    from torch.profiler import ProfilerActivity, profile

    ids = [[1] for _ in range(batch)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        runner.forward(ForwardMode.DECODE, ids)
    families = {"attention": 0.0, "gemm": 0.0, "other ops": 0.0}
    total = 0.0
    for event in prof.key_averages():
        ms = event.self_cpu_time_total / 1e3
        name = event.key
        total += ms
        # by op, not by library: the compiled linears and norms are sluice_cpu ops too
        if any(k in name for k in ("addmm", "aten::mm", "_int_mm", "linear", "matmul", "bmm")):
            families["gemm"] += ms
        elif any(k in name for k in ("paged_attention", "scaled_dot_product", "index_select")):
            families["attention"] += ms
        else:
            families["other ops"] += ms
    families["total (profiled)"] = total
    return families


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default="")
    parser.add_argument(
        "--configs", default="fp32-torch,fp32-cpu-fused,bf16-cpu,bf16-cpu-fused,w8a8-cpu-fused"
    )
    parser.add_argument("--batch-sizes", default="1,16,48")
    parser.add_argument("--prompt-len", type=int, default=120)
    parser.add_argument("--decode-steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--clock", default="wall", choices=["wall", "cpu"],
        help="cpu: this process's CPU time (with --threads 1, steady on a shared machine)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.model_path) if args.model_path else resolve_model_path(
        "smollm2-135m", default_cache_dir())
    configs = args.configs.split(",")
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    results: dict[tuple[str, int], tuple[float, float]] = {}
    profiles: dict[tuple[str, int], dict[str, float]] = {}
    for config in configs:
        model, dtype = load(config, path)
        for b in sizes:
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            prefill, decode, runner = measure(model, dtype, b, args.prompt_len,
                                              args.decode_steps, clock)  # fmt: skip
            results[config, b] = (prefill, decode)
            if args.profile:
                profiles[config, b] = profile_decode(runner, b)
            print(f"{config:<12} batch {b:>3}: prefill {prefill * 1e3:8.1f} ms "
                  f"({b * args.prompt_len / prefill:7.0f} tok/s), decode {decode * 1e3:7.1f} ms/step "
                  f"({b / decode:6.0f} tok/s)", flush=True)
        del model
    base = configs[0]
    print(f"\nspeed-up over {base} (same run, {torch.get_num_threads()} threads, "
          f"{args.clock} clock, prompt {args.prompt_len}):")
    for config in configs[1:]:
        for b in sizes:
            p0, d0 = results[base, b]
            p1, d1 = results[config, b]
            print(f"  {config:<12} batch {b:>3}: prefill {p0 / p1:5.2f}x, decode {d0 / d1:5.2f}x")
    for (config, b), fam in profiles.items():
        parts = ", ".join(f"{k} {v:.1f} ms" for k, v in fam.items())
        print(f"profile {config} batch {b}: {parts}")


if __name__ == "__main__":
    main()
