"""Decode step time with tensor parallelism on the CPU: TP=1 against TP=2 (gloo).

    python -m benchmarks.cpu.tensor_parallel [--batch-sizes 1,16] [--context 128]
        [--dtypes float32,bfloat16] [--decode-steps 16]

A random model with SmolLM2-135M's shapes but 8 query heads (SmolLM2's 9 do not split in
two): hidden 576, 30 layers, head_dim 64, 2 KV heads, MLP 1536, vocab 49152. Each
configuration prefills `batch` prompts of `--context` tokens, then times decode steps of
the whole batch, with the CPU attention kernels and fused ops the server runs. TP=2 runs
two ranks as processes (torch.multiprocessing, gloo), each with cores/2 torch threads;
TP=1 runs with all the cores, and with one (what each rank gets). The collectives (the
model's all-reduces and the logits' all-gather) are timed where they are issued, on rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.multiprocessing as mp

from benchmarks.cpu.step import measure
from sluice.runtime.distributed.group import SINGLE_RANK, ProcessGroup, TensorParallelGroup
from sluice.runtime.distributed.topology import free_port
from sluice.runtime.model import cpu_fused_ops
from sluice.runtime.model.loader import load_model

SHAPES = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=8, head_dim=64, num_key_value_heads=2, max_position_embeddings=2048,
    rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
)  # fmt: skip


@dataclass(frozen=True)
class TimedGroup(ProcessGroup):
    """A `ProcessGroup` that adds up the time its device collectives take."""

    spent: dict[str, float] = field(default_factory=dict)

    def _timed(self, name: str, fn, x: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        out = fn(x)
        self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - start
        self.spent[name + " calls"] = self.spent.get(name + " calls", 0) + 1
        return out

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed("all_reduce", super().all_reduce, x)

    def all_gather_last_dim(self, x: torch.Tensor) -> torch.Tensor:
        return self._timed("all_gather", super().all_gather_last_dim, x)


def make_model(folder: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**SHAPES)).save_pretrained(folder, safe_serialization=True)
    return folder


def run(tp: TensorParallelGroup, folder: Path, dtypes: list[str], sizes: list[int],
        context: int, steps: int) -> list[dict]:  # fmt: skip
    rows = []
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        model, _ = load_model(folder, "cpu", dtype, "cpu", tp)
        if (reason := cpu_fused_ops.enable(model)) is not None:
            print(f"fused ops off: {reason}")
        for b in sizes:
            measure(model, dtype, b, 16, 2, time.perf_counter)  # warm-up
            spent = getattr(tp, "spent", {})
            spent.clear()
            _, decode, _ = measure(model, dtype, b, context, steps, time.perf_counter)
            # `measure` runs a prefill and one untimed decode before the timed steps
            per_call = dict(spent)
            forwards = steps + 2
            rows.append({
                "dtype": dtype_name, "batch": b, "tp": tp.size, "threads": torch.get_num_threads(),
                "decode_ms": decode * 1e3, "tok_s": b / decode,
                "all_reduce_ms": 1e3 * per_call.get("all_reduce", 0.0) / forwards,
                "all_reduces": per_call.get("all_reduce calls", 0) / forwards,
                "all_gather_ms": 1e3 * per_call.get("all_gather", 0.0) / forwards,
            })  # fmt: skip
        del model
    return rows


def _rank(rank: int, size: int, port: int, threads: int, out: str, *rest) -> None:  # type: ignore[no-untyped-def]
    torch.set_num_threads(threads)
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size
    )
    group = TimedGroup(rank=rank, size=size, local_size=size,
                       device_group=torch.distributed.group.WORLD)  # fmt: skip
    rows = run(group, *rest)
    if rank == 0:
        Path(out).write_text(json.dumps(rows))
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--decode-steps", type=int, default=16)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--model-dir", default=str(Path(tempfile.gettempdir()) / "sluice-tp-bench"))
    args = parser.parse_args()
    folder = make_model(Path(args.model_dir))
    cores = len(os.sched_getaffinity(0))
    common = (folder, args.dtypes.split(","), [int(b) for b in args.batch_sizes.split(",")],
              args.context, args.decode_steps)  # fmt: skip
    rows = []
    for threads in sorted({cores, 1}, reverse=True):
        torch.set_num_threads(threads)
        rows += run(SINGLE_RANK, *common)
    out = Path(tempfile.mkdtemp()) / "tp2.json"
    mp.spawn(_rank, args=(2, free_port(), max(1, cores // 2), str(out), *common), nprocs=2)
    rows += json.loads(out.read_text())
    print(f"{'dtype':<9} {'batch':>5} {'tp':>3} {'threads':>7} {'ms/step':>8} {'tok/s':>7} "
          f"{'all-reduce ms/step (n)':>23} {'all-gather ms/step':>19}")
    for r in rows:
        print(f"{r['dtype']:<9} {r['batch']:>5} {r['tp']:>3} {r['threads']:>7} "
              f"{r['decode_ms']:8.1f} {r['tok_s']:7.1f} "
              f"{r['all_reduce_ms']:15.2f} ({r['all_reduces']:.0f}) {r['all_gather_ms']:19.2f}")


if __name__ == "__main__":
    main()
