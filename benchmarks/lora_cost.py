"""What LoRA costs on this machine: the same workload with 0 (the base model alone), 1, 4
and 8 adapters mixed in one batch.

    python -m benchmarks.lora_cost --mode step [--num-prompts 8] [--input-len 64] [--rounds 20]
    python -m benchmarks.lora_cost --mode serve [--model smollm2-135m] [--num-prompts 32]
        [--input-len 64] [--output-len 64] [--rank 16] [--server-args "--dtype float32"]

`--mode step` (the default): one ModelWorker with every adapter loaded times the same
decode forward (batch `--num-prompts`, each row at position `--input-len`) with its rows
on the base model, or spread over 1, 4 or 8 adapters, the configurations interleaved round
after round so that a drifting machine load hits all of them alike; medians are reported.
`--mode serve`: the whole workload through the real Scheduler and ModelWorker (no HTTP), one
configuration after another, as `engine_bench` runs it (sensitive to load drift).

Adapters are random rank-`--rank` PEFT-format adapters on q/k/v/o and gate/up/down,
written to a temporary folder; requests are spread round-robin over them (with
`--max-loras` the number of adapters, so every batch mixes all of them). Prints output
tok/s and the mean decode tick per configuration, and each one's cost against the base
model; `--output-file` writes them as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.engine.forward_input import ForwardInput, RowInput  # noqa: E402
from sluice.runtime.engine.model_worker import ModelWorker  # noqa: E402
from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq  # noqa: E402
from sluice.runtime.lora.adapter import module_shapes  # noqa: E402
from sluice.runtime.model.config import ModelConfig  # noqa: E402
from sluice.runtime.model.loader import resolve_model_path  # noqa: E402
from sluice.runtime.model.registry import read_model_config  # noqa: E402
from sluice.runtime.scheduler.process import build_scheduler  # noqa: E402
from sluice.runtime.server_args import ServerArgs  # noqa: E402


def write_adapter(folder: Path, config: ModelConfig, rank: int, seed: int) -> Path:
    """A random PEFT-format LoRA adapter (non-zero B) for every projection of every layer."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for module, (fan_in, fan_out) in module_shapes(config).items():
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = (
                torch.randn(fan_out, rank, generator=g) / rank**0.5 * 0.1
            )
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
        "target_modules": list(module_shapes(config)), "base_model_name_or_path": ""}))  # fmt: skip
    return folder


def run(
    args: ServerArgs, path: Path, adapters: int, prompts: list[list[int]], output_len: int
) -> dict:
    worker = ModelWorker(args, path)
    scheduler = build_scheduler(args, worker)
    step = scheduler.step_overlap if args.overlap_schedule else scheduler.step
    scheduler.handle(
        TokenizedGenerateReq(
            "warm", prompts[0][:8], SamplingParams(max_new_tokens=2, temperature=0)
        )
    )
    while scheduler.has_work:
        step()
        scheduler.take_output()
    for i, ids in enumerate(prompts):
        lora = (i % adapters) + 1 if adapters else 0
        sp = SamplingParams(max_new_tokens=output_len, temperature=0, ignore_eos=True, lora_id=lora)
        scheduler.handle(TokenizedGenerateReq(f"r{i}", ids, sp))
    decode_s, decode_ticks = 0.0, 0
    began = time.perf_counter()
    while scheduler.has_work:
        t0 = time.perf_counter()
        tick = step()
        if tick is not None and tick.num_decode == len(tick.rids):
            decode_s += time.perf_counter() - t0
            decode_ticks += 1
        scheduler.take_output()
    wall = time.perf_counter() - began
    tokens = len(prompts) * output_len
    scheduler.executor.close()
    return {"adapters": adapters, "output_tok_s": tokens / wall, "wall_s": wall,
            "decode_tick_ms": 1000 * decode_s / max(decode_ticks, 1), "decode_ticks": decode_ticks}  # fmt: skip


def step_costs(args: ServerArgs, path: Path, counts: list[int], batch: int, ctx: int,
               rounds: int) -> list[dict]:  # fmt: skip
    """Median decode-forward time per adapter count, configurations interleaved."""
    import statistics

    worker = ModelWorker(args, path)
    rng = random.Random(0)
    vocab = worker.model_config.vocab_size
    prefill = [
        RowInput(row=i, start=0, length=ctx, slot_start=0,
                 slots=list(range(1 + i * (ctx + 1), 1 + (i + 1) * (ctx + 1))), token_start=0,
                 tokens=[rng.randrange(100, vocab - 100) for _ in range(ctx + 1)], sample=False)
        for i in range(batch)
    ]  # fmt: skip
    worker.run(ForwardInput(prefill, []))

    def decode(n: int) -> ForwardInput:
        rows = [RowInput(row=i, start=ctx, length=1, slot_start=0, slots=[], token_start=0,
                         tokens=[], sample=False, lora=(i % n) + 1 if n else 0)
                for i in range(batch)]  # fmt: skip
        return ForwardInput(rows, [])

    times: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(rounds + 2):
        for n in counts:
            fi = decode(n)
            t0 = time.perf_counter()
            worker.run(fi)
            if r >= 2:  # two warm-up rounds (slots filled, caches warm)
                times[n].append(time.perf_counter() - t0)
    return [{"adapters": n, "decode_step_ms": 1000 * statistics.median(times[n])} for n in counts]


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--mode", default="step", choices=("step", "serve"))
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--adapters", default="0,1,4,8")
    p.add_argument("--server-args", default="", help="more `sluice serve` flags")
    p.add_argument("--output-file", default="")
    ns = p.parse_args()
    path = resolve_model_path(ns.model, default_cache_dir())
    config = read_model_config(path)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, config.vocab_size - 100) for _ in range(ns.input_len)]
               for _ in range(ns.num_prompts)]  # fmt: skip
    counts = [int(c) for c in ns.adapters.split(",")]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    base = ServerArgs.from_cli_args(
        parser.parse_args(["--model", ns.model, *shlex.split(ns.server_args)])
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = [
            write_adapter(Path(tmp) / f"a{i}", config, ns.rank, i) for i in range(max(counts))
        ]
        if ns.mode == "step":
            n = max(counts)
            modules = tuple(f"a{i}={folders[i]}" for i in range(n))
            args = dataclasses.replace(base, enable_lora=True, lora_modules=modules, max_loras=n,
                                       max_lora_rank=ns.rank, max_cpu_loras=n)  # fmt: skip
            steps = step_costs(args, path, counts, ns.num_prompts, ns.input_len, ns.rounds)
            first = steps[0]["decode_step_ms"]
            print(f"decode step, batch {ns.num_prompts} at position {ns.input_len}, rank {ns.rank}, "
                  f"model {ns.model}, {ns.rounds} interleaved rounds (medians)")  # fmt: skip
            print("adapters | decode step ms | vs base")
            for r in steps:
                r["vs_base"] = r["decode_step_ms"] / first
                print(f"{r['adapters']:>8} | {r['decode_step_ms']:>14.2f} | {r['vs_base']:.2f}x")
            if ns.output_file:
                Path(ns.output_file).write_text(json.dumps(steps, indent=2))
            return 0
        for n in counts:
            args = base
            if n:
                modules = tuple(f"a{i}={folders[i]}" for i in range(n))
                args = dataclasses.replace(base, enable_lora=True, lora_modules=modules, max_loras=n,
                                           max_lora_rank=ns.rank, max_cpu_loras=n)  # fmt: skip
            result = run(args, path, n, prompts, ns.output_len)
            results.append(result)
            print(json.dumps(result), flush=True)
    base_tick = results[0]["decode_tick_ms"] if counts[0] == 0 else None
    print(f"\n{ns.num_prompts} requests, input {ns.input_len}, output {ns.output_len}, rank {ns.rank}, "
          f"model {ns.model}")  # fmt: skip
    print("adapters | output tok/s | decode tick ms | decode cost vs base")
    for r in results:
        cost = f"{r['decode_tick_ms'] / base_tick:.2f}x" if base_tick else "-"
        print(
            f"{r['adapters']:>8} | {r['output_tok_s']:>12.1f} | {r['decode_tick_ms']:>14.1f} | {cost}"
        )
    if ns.output_file:
        Path(ns.output_file).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
