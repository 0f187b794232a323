"""Overlap on CUDA: the stream executor (the forward enqueued on a side stream from the
scheduler thread, tokens copied back into pinned memory, an event per batch) gives exactly
the tokens of the thread executor on the same overlap-loop schedule, constrained rows and
penalties included."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sluice.runtime.engine.executor import StreamExecutor, ThreadExecutor
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import Constraint, SamplingParams, TokenizedGenerateReq
from sluice.runtime.scheduler.process import build_scheduler
from sluice.runtime.server_args import ServerArgs

PROMPTS = [[5 + (i * 11 + j * 3) % 170 for j in range(5 + (i * 7) % 29)] for i in range(24)]


def run(model_path, device: str, executor_kind: str) -> dict[str, list[int]]:
    args = dataclasses.replace(
        ServerArgs(model=str(model_path)), device=device, max_total_tokens=8192,
        max_running_requests=32, disable_cuda_graph=True,
    )  # fmt: skip
    worker = ModelWorker(args, model_path)
    scheduler = build_scheduler(args, worker)
    scheduler.executor.close()
    scheduler.executor = (StreamExecutor if executor_kind == "stream" else ThreadExecutor)(worker)
    for i, p in enumerate(PROMPTS):
        sp = SamplingParams(max_new_tokens=12 + i % 9, temperature=0.0, ignore_eos=True,
                            frequency_penalty=0.3 if i % 3 == 0 else 0.0)  # fmt: skip
        if i % 5 == 0:
            sp = SamplingParams(max_new_tokens=24, temperature=0.0,
                                constraint=Constraint("choice", json.dumps(["yes", "no"])))  # fmt: skip
        scheduler.handle(TokenizedGenerateReq(f"r{i}", p, sp))
    outputs: dict[str, list[int]] = {}
    while scheduler.has_work:
        scheduler.step_overlap()
        out = scheduler.take_output()
        for u in out.updates if out else []:
            outputs.setdefault(u.rid, []).extend(u.new_token_ids)
    scheduler.executor.close()
    scheduler.check_integrity()
    return outputs


def test_the_stream_executor_equals_the_thread_executor(gpu_model_path, device):
    if device != "cuda":
        pytest.skip("the stream executor's CUDA streams need a GPU")
    assert run(gpu_model_path, device, "stream") == run(gpu_model_path, device, "thread")
