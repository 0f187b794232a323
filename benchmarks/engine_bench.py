"""The engine alone: the real Scheduler and ModelWorker in one process, no HTTP, no
detokenizer, no client. Where `bench_serving` measures what a user gets, this measures what
the scheduler and the model do with the same requests, and where the time goes.

    python -m benchmarks.engine_bench --num-prompts 48 --random-input-len 160 \
        --random-input-min 80 --random-output-len 224 --random-output-min 32 \
        --loops normal,overlap [--server-args "--dtype float32"]

Every request arrives at t=0 (ignore_eos, its own output length). For each loop it prints
output tok/s (wall and per CPU second of this process), ticks, mean requests per prefill
tick, and the scheduler's per-tick breakdown (schedule / launch / forward / wait / process),
all from one run, loops alternating when `--repeats` > 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.serving import dataset  # noqa: E402
from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.engine.model_worker import ModelWorker  # noqa: E402
from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq  # noqa: E402
from sluice.runtime.model.loader import resolve_model_path  # noqa: E402
from sluice.runtime.scheduler.process import build_scheduler  # noqa: E402
from sluice.runtime.server_args import ServerArgs  # noqa: E402


def run_once(args: ServerArgs, path: Path, requests: list[dataset.BenchRequest], tokenizer) -> dict:
    worker = ModelWorker(args, path)
    scheduler = build_scheduler(args, worker)
    step = scheduler.step_overlap if args.overlap_schedule else scheduler.step
    warm = TokenizedGenerateReq(
        "warm", tokenizer.encode("Hello"), SamplingParams(max_new_tokens=2, temperature=0)
    )
    scheduler.handle(warm)
    while scheduler.has_work:
        step()
        scheduler.take_output()
    scheduler.timing.take()
    start_counters = dataclasses.replace(scheduler.counters)
    for i, r in enumerate(requests):
        ids = tokenizer.encode(r.prompt, add_special_tokens=False)
        sp = SamplingParams(max_new_tokens=r.output_len, temperature=0, ignore_eos=True)
        scheduler.handle(TokenizedGenerateReq(f"r{i}", ids, sp))
    wall0, cpu0 = time.perf_counter(), time.process_time()
    ticks = 0
    while scheduler.has_work:
        if step() is not None:
            ticks += 1
        scheduler.take_output()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    c = scheduler.counters
    generated = c.generated_tokens - start_counters.generated_tokens
    batches = c.prefill_batches - start_counters.prefill_batches
    rows = c.prefill_rows - start_counters.prefill_rows
    timing = scheduler.timing.take()
    scheduler.executor.close()
    per_tick = {k: 1000 * v / max(timing.ticks, 1) for k, v in vars(timing).items() if k != "ticks"}
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "output_tokens": generated,
        "output_tok_per_s": generated / wall,
        "ticks": ticks,
        "prefill_ticks": batches,
        "mean_requests_per_prefill_tick": rows / batches if batches else 0.0,
        "per_tick_ms": per_tick,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--random-input-len", type=int, default=160)
    p.add_argument("--random-input-min", type=int, default=80)
    p.add_argument("--random-output-len", type=int, default=224)
    p.add_argument("--random-output-min", type=int, default=32)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--loops", default="normal,overlap")
    p.add_argument("--server-args", default="", help="extra `sluice serve` flags, one string")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--output-file", default="")
    ns = p.parse_args(argv)
    from transformers import AutoTokenizer

    path = resolve_model_path(ns.model, default_cache_dir())
    tokenizer = AutoTokenizer.from_pretrained(path)
    requests = dataset.sample_random_requests(
        tokenizer, num_prompts=ns.num_prompts, input_len=ns.random_input_len,
        output_len=ns.random_output_len, range_ratio=0.0, seed=ns.seed,
        input_min=ns.random_input_min, output_min=ns.random_output_min,
    )  # fmt: skip
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    results: dict[str, list[dict]] = {}
    for _ in range(ns.repeats):
        for loop in ns.loops.split(","):
            flags = [*shlex.split(ns.server_args), "--model", ns.model, "--device", "cpu"]
            flags.append("--disable-overlap-schedule" if loop == "normal" else "--enable-overlap-schedule")
            args = ServerArgs.from_cli_args(parser.parse_args(flags))
            r = run_once(args, path, requests, tokenizer)
            results.setdefault(loop, []).append(r)
            t = r["per_tick_ms"]
            print(
                f"{loop:8s} {r['output_tok_per_s']:7.1f} out tok/s  {r['wall_s']:6.1f} s wall "
                f"{r['cpu_s']:6.1f} s cpu  ticks {r['ticks']}  req/prefill-tick "
                f"{r['mean_requests_per_prefill_tick']:.1f}  per tick: "
                + " ".join(f"{k}={v:.1f}ms" for k, v in t.items()),
                flush=True,
            )
    if ns.output_file:
        Path(ns.output_file).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
