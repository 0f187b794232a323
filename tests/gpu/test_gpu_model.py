"""The whole model on the GPU (bf16) through each attention backend, and decode through
captured CUDA graphs.

- Greedy across backends: the torch backend generates greedily (the reference); triton and
  flashinfer are teacher-forced along the same tokens, and wherever the reference's top
  token wins by a clear margin they must pick it too. Their own free-running greedy output
  is compared and reported; with a trained model (`SLUICE_GPU_MODEL_TRAINED=1`, real
  SmolLM2) it must equal the reference token for token.
- CUDA graphs: each decode step's replayed logits equal the eager forward's.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from gpu_support import ON_CPU, backend_for
from paged_model import PagedSession

from sluice.runtime.engine.cuda_graph import CudaGraphRunner
from sluice.runtime.model.loader import load_model

STEPS = 8 if ON_CPU else 32
CHUNK = 256
TRAINED = os.environ.get("SLUICE_GPU_MODEL_TRAINED") == "1"
TEXTS = [
    "The capital of France is",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 6,
    "def fibonacci(n):\n    " + "# compute the sequence iteratively, then print it\n    " * 40,
    "Hi",
]
RESULTS = os.environ.get("SLUICE_GPU_RESULTS")  # a folder: write measured numbers there


@pytest.fixture(scope="module")
def prompts(gpu_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gpu_model_path)
    ids = [tok(t)["input_ids"] for t in TEXTS]
    return [p[: 64 if ON_CPU else 1000] for p in ids]


def _model(path, name, device, dtype, page_size):
    model, config = load_model(path, device, dtype, backend_for(name, device, page_size))
    return model


def _session(model, device, dtype, page_size):
    return PagedSession(model, page_size=page_size, max_total_tokens=16384, max_requests=16,
                        max_context=2048, device=device, dtype=dtype)  # fmt: skip


@torch.inference_mode()
def _run(model, prompts, device, dtype, page_size, forced=None):
    """Prefill (chunked) then STEPS decode steps; greedy unless `forced` gives the tokens."""
    session = _session(model, device, dtype, page_size)
    reqs, logits = session.prefill(prompts, chunk=CHUNK)
    all_logits, tokens = [logits], []
    for step in range(STEPS):
        nxt = forced[step] if forced is not None else logits.argmax(-1).tolist()
        tokens.append(nxt)
        logits = model.forward(session.decode_batch(reqs, nxt))
        all_logits.append(logits)
    return tokens, all_logits


def _clear_decisions_agree(ref_logits, logits, margin: float) -> tuple[int, int]:
    """(decisions with a clear reference margin, how many of them this backend shares)."""
    clear = agree = 0
    for ref, got in zip(ref_logits, logits, strict=True):
        top2 = ref.float().topk(2, dim=-1).values
        is_clear = (top2[:, 0] - top2[:, 1]) > margin
        clear += int(is_clear.sum())
        agree += int((is_clear & (ref.argmax(-1) == got.argmax(-1))).sum())
    return clear, agree


@pytest.mark.parametrize("page_size", [1, 16])
def test_greedy_is_the_same_across_backends(gpu_model_path, prompts, device, dtype, page_size):
    names = ["torch", "triton"] + ([] if ON_CPU else ["flashinfer"])
    reference_model = _model(gpu_model_path, "torch", device, dtype, page_size)
    ref_tokens, ref_logits = _run(reference_model, prompts, device, dtype, page_size)
    del reference_model
    report = {}
    for name in names[1:]:
        model = _model(gpu_model_path, name, device, dtype, page_size)
        _, forced_logits = _run(model, prompts, device, dtype, page_size, forced=ref_tokens)
        clear, agree = _clear_decisions_agree(ref_logits, forced_logits, margin=0.5)
        max_diff = max((a.float() - b.float()).abs().max().item()
                       for a, b in zip(ref_logits, forced_logits, strict=True))  # fmt: skip
        free_tokens, _ = _run(model, prompts, device, dtype, page_size)
        same = sum(
            next((s for s in range(STEPS) if free_tokens[s][r] != ref_tokens[s][r]), STEPS)
            for r in range(len(prompts))
        )
        report[name] = {"clear_decisions": clear, "agreeing": agree, "max_logit_diff": max_diff,
                        "greedy_tokens_equal_before_divergence": same,
                        "greedy_tokens": STEPS * len(prompts)}  # fmt: skip
        del model
        assert clear > 0 and agree == clear, f"{name}: {report[name]}"
        if TRAINED:
            assert free_tokens == ref_tokens, f"{name} greedy differs: {report[name]}"
    print(f"greedy across backends (page size {page_size}): {json.dumps(report)}")
    if RESULTS:
        with open(os.path.join(RESULTS, f"greedy_page{page_size}.json"), "w") as f:
            json.dump(report, f, indent=1)


@pytest.mark.parametrize("name", ["triton", "flashinfer"])
def test_cuda_graph_decode_equals_eager(gpu_model_path, prompts, device, dtype, name):
    if device != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    model = _model(gpu_model_path, name, device, dtype, 16)
    session = _session(model, device, dtype, 16)
    with torch.inference_mode():
        reqs, logits = session.prefill(prompts + prompts[:1], chunk=CHUNK)  # 5 requests
        more, more_logits = session.prefill([p[:40] for p in prompts] * 3, chunk=CHUNK)
        runner = CudaGraphRunner(model, [1, 2, 4, 8, 16])
        runner.capture(session.table.req_to_token, session.kv)
        last = {r: t for r, t in zip(reqs + more, torch.cat([logits, more_logits]).argmax(-1)
                                     .tolist(), strict=True)}  # fmt: skip
        # buckets 8 (5 requests padded), 1, then 16 (all 17 but one: 16 exactly)
        for use in [reqs] * 3 + [reqs[:1]] * 3 + [(reqs + more)[:16]] * 2:
            batch = session.decode_batch(use, [last[r] for r in use])
            assert runner.can_run(batch)
            eager = model.forward(batch)
            replayed = runner.replay(batch)  # rewrites the same K/V, then attends
            torch.testing.assert_close(replayed, eager, atol=5e-2, rtol=5e-2)
            clear, agree = _clear_decisions_agree([eager], [replayed], margin=0.5)
            assert agree == clear
            last.update(zip(use, eager.argmax(-1).tolist(), strict=True))
