"""The peer: Hugging Face transformers' own `generate`, static batching, fp32 or bf16 on the
CPU (`--peer hf-fp32|hf-bf16`), or bf16 on the GPU the server used (`--peer-device cuda`).

Same prompts and output lengths as the server run. Requests are batched in arrival order;
a batch is left-padded and generated greedily for its longest request's output length
(`min_new_tokens = max_new_tokens`, the peer's ignore_eos), so shorter requests in it wait
for the longest: the cost static batching pays and continuous batching avoids. Every
request arrives at t=0, so a request's E2E is the end of its batch.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.serving.dataset import BenchRequest
from benchmarks.serving.metrics import PeerBatch, plan_batches

# a static batch "fits" when its padded rows hold at most this many tokens (prompt + output
# of its longest request, times its rows): a few hundred MiB of KV and activations
PEER_MAX_BATCH_TOKENS = 65536
HF_PEERS = {"hf-fp32": "float32", "hf-bf16": "bfloat16"}


def peer_batch_size(
    requested: int, max_concurrency: int, requests: Sequence[BenchRequest] = ()
) -> int:
    """`--peer-batch-size` if given, else the server run's `--max-concurrency` (the same
    number of requests in flight), else every request in one batch when it fits
    (`PEER_MAX_BATCH_TOKENS` padded tokens), else the fewest equal batches that fit."""
    if requested > 0:
        return requested
    if max_concurrency > 0:
        return max_concurrency
    if not requests:
        return 1
    longest = max(r.prompt_len for r in requests) + max(r.output_len for r in requests)
    rows = max(1, PEER_MAX_BATCH_TOKENS // longest)
    batches = -(-len(requests) // rows)
    return -(-len(requests) // batches)


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_hf_peer(
    model_path: Path,
    requests: Sequence[BenchRequest],
    batch_size: int,
    threads: int,
    log: Callable[[str], None] = print,
    device: str = "cpu",
    dtype: str = "float32",
) -> list[PeerBatch]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device)
    model.eval()

    def generate(prompts: list[str], new_tokens: int) -> int:
        enc = tokenizer(prompts, return_tensors="pt", padding=True).to(device)
        with torch.inference_mode():
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        return out.shape[1] - enc["input_ids"].shape[1]

    generate([requests[0].prompt], 2)  # warm-up, off the clock like the server's
    batches = plan_batches(len(requests), batch_size)
    log(
        f"peer: transformers generate, {len(batches)} batches of up to {batch_size}, "
        f"{dtype} on {device}, {threads} torch threads"
    )
    start = time.perf_counter()
    done = []
    for i, rows in enumerate(batches):
        chosen = [requests[j] for j in rows]
        longest = max(r.output_len for r in chosen)
        produced = generate([r.prompt for r in chosen], longest)
        if produced != longest:
            raise RuntimeError(f"peer batch {i} generated {produced} tokens, wanted {longest}")
        end = time.perf_counter() - start
        done.append(
            PeerBatch(
                prompt_lens=tuple(r.prompt_len for r in chosen),
                output_lens=tuple(r.output_len for r in chosen),
                generated_per_row=longest,
                end_s=end,
            )
        )
        log(
            f"  peer batch {i + 1}/{len(batches)}: {len(chosen)} requests, "
            f"{longest} new tokens each, done at {end:.1f}s"
        )
    return done
