"""How many long requests run at once in one KV budget, with and without the window pool.

Launches the real server twice on the same model and the same KV budget
(`--cpu-kv-cache-gib`): once with `--disable-hybrid-swa-memory` (every layer keeps every
token) and once with the default (sliding-window layers keep only their window). Each time
it sends the same `--requests` requests of `--prompt-len` random tokens and `--max-tokens`
greedy tokens all at once and records, from `/server_info`, the most requests running at
once, the pools' sizes and the retractions. Prints one table.

    python benchmarks/window_capacity.py --model gemma3-270m
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.serving.server import launched_server, serve_command  # noqa: E402

MODES = {"every token (--disable-hybrid-swa-memory)": "--disable-hybrid-swa-memory",
         "window pool (default)": ""}  # fmt: skip


def run(args: argparse.Namespace, extra: str, prompts: list[list[int]]) -> dict[str, object]:
    url = f"http://127.0.0.1:{args.port}"
    flags = (f"--dtype {args.dtype} --cpu-kv-cache-gib {args.cpu_kv_cache_gib} "
             f"--max-running-requests {args.max_running_requests} {args.server_args} {extra}")  # fmt: skip
    with launched_server(serve_command(args.model, url, flags), url, timeout_s=600):
        info = httpx.get(f"{url}/server_info", timeout=10).json()
        peak, done = 0, threading.Event()

        def watch() -> None:
            nonlocal peak
            while not done.is_set():
                stats = httpx.get(f"{url}/server_info", timeout=10).json()["scheduler_stats"]
                peak = max(peak, stats.get("running_requests", 0))
                done.wait(0.2)

        def send(ids: list[int]) -> int:
            body = {
                "input_ids": ids,
                "sampling_params": {
                    "max_new_tokens": args.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            }
            r = httpx.post(f"{url}/generate", json=body, timeout=3600)
            r.raise_for_status()
            return len(r.json()["output_ids"])

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(len(prompts)) as pool:
            generated = sum(pool.map(send, prompts))
        wall = time.perf_counter() - start
        done.set()
        watcher.join()
        stats = httpx.get(f"{url}/server_info", timeout=10).json()["scheduler_stats"]
    return {
        "full": info["scheduler_stats"]["max_total_tokens"],
        "window": info["scheduler_stats"].get("swa_total_tokens", 0),
        "peak": peak,
        "retractions": stats["retractions_total"],
        "tok/s": generated / wall,
        "wall": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--cpu-kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-running-requests", type=int, default=64)
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--server-args", default="", help="more flags for both servers")
    p.add_argument("--port", type=int, default=30123)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = random.Random(args.seed)
    prompts = [
        [rng.randrange(10, 20000) for _ in range(args.prompt_len)] for _ in range(args.requests)
    ]
    rows = {name: run(args, extra, prompts) for name, extra in MODES.items()}
    print(f"\n{args.requests} requests of {args.prompt_len} + {args.max_tokens} tokens at once; "
          f"{args.model}, {args.dtype}, KV budget {args.cpu_kv_cache_gib} GiB, "
          f"--max-running-requests {args.max_running_requests} {args.server_args}")  # fmt: skip
    print(
        "| KV layout | full pool (tokens) | window pool (tokens) | most running at once "
        "| retractions | output tok/s | wall s |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['full']} | {r['window']} | {r['peak']} | {r['retractions']} "
            f"| {r['tok/s']:.1f} | {r['wall']:.0f} |"
        )
    before, after = (r["peak"] for r in rows.values())
    print(f"\nconcurrent requests: {after} / {before} = {after / max(before, 1):.2f}x")


if __name__ == "__main__":
    main()
