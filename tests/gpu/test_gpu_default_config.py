"""The shipped GPU default (overlap loop on a CUDA stream, CUDA graphs, the auto backend,
auto sizes) with sampled rows (temperature 1, top-p, top-k, penalties) among greedy ones:
greedy rows equal the normal loop run eagerly; seeded sampled rows give the same tokens
on a second run; every request gets its tokens."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq
from sluice.runtime.scheduler.process import build_scheduler
from sluice.runtime.server_args import ServerArgs

PROMPTS = [[5 + (i * 13 + j * 5) % 170 for j in range(4 + (i * 5) % 31)] for i in range(40)]


def _params(i: int) -> SamplingParams:
    n = 10 + i % 13
    if i % 2 == 0:
        return SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
    return SamplingParams(max_new_tokens=n, temperature=1.0, top_p=0.9 if i % 3 else 1.0,
                          top_k=40 if i % 5 == 1 else -1, frequency_penalty=0.2 if i % 7 == 1 else 0.0,
                          seed=1000 + i, ignore_eos=True)  # fmt: skip


def run(model_path, default: bool) -> dict[str, list[int]]:
    base = ServerArgs(model=str(model_path))
    args = base if default else dataclasses.replace(base, disable_overlap_schedule=True,
                                                     disable_cuda_graph=True)  # fmt: skip
    args = dataclasses.replace(args, max_total_tokens=16384)
    worker = ModelWorker(args, model_path)
    assert args.overlap_schedule is default
    scheduler = build_scheduler(args, worker)
    for i, p in enumerate(PROMPTS):
        scheduler.handle(TokenizedGenerateReq(f"r{i}", p, _params(i)))
    outputs: dict[str, list[int]] = {}
    while scheduler.has_work:
        scheduler.step_overlap() if default else scheduler.step()
        out = scheduler.take_output()
        for u in out.updates if out else []:
            outputs.setdefault(u.rid, []).extend(u.new_token_ids)
    scheduler.executor.close()
    scheduler.check_integrity()
    if default:
        assert worker.graph_runner is not None, "the default captures decode CUDA graphs"
    return outputs


def test_the_default_gpu_configuration_serves_greedy_and_sampled_rows(gpu_model_path, device):
    if device != "cuda":
        pytest.skip("overlap on a CUDA stream and CUDA graphs need a GPU")
    first, again, eager = run(gpu_model_path, True), run(gpu_model_path, True), run(gpu_model_path, False)
    for i in range(len(PROMPTS)):
        rid, want = f"r{i}", _params(i).max_new_tokens
        assert len(first[rid]) == want, rid
        if i % 2 == 0:
            assert first[rid] == eager[rid], f"greedy {rid}: default vs eager normal loop"
        else:
            assert first[rid] == again[rid], f"seeded {rid}: two runs of the default"
