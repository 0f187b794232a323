"""The model on the Triton backend (interpreter, CPU, fp32) gives transformers' logits:
prefill in chunks over a cached prefix, then decode steps, on a page size of 16; a Llama
with GQA group 3, a Qwen3 (q/k norms, head_dim 32) and a Qwen3-MoE (its experts in torch)."""

from __future__ import annotations

import pytest
import torch
from paged_model import PagedSession
from tiny_model import make_tiny_llama, make_tiny_qwen3, make_tiny_qwen3_moe

from sluice.runtime.model.loader import load_model

pytest.importorskip("triton")
from sluice.runtime.attention.triton.backend import TritonAttentionBackend  # noqa: E402

MAKERS = {
    # GQA group 3 (6 heads over 2 KV heads)
    "llama_gqa3": lambda p: make_tiny_llama(p, seed=3, num_attention_heads=6,
                                            num_key_value_heads=2, hidden_size=48),
    "qwen3": lambda p: make_tiny_qwen3(p, seed=4, initializer_range=0.08),
    "qwen3_moe": lambda p: make_tiny_qwen3_moe(p, seed=5, initializer_range=0.08),
}  # fmt: skip


# the MoE one runs longest under the interpreter (about 20 s here)
PARAMS = [pytest.param(n, marks=pytest.mark.slow) if n == "qwen3_moe" else n for n in MAKERS]


@pytest.fixture(scope="module", params=PARAMS)
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoModelForCausalLM

    folder = MAKERS[request.param](tmp_path_factory.mktemp(request.param))
    ours, _ = load_model(folder, "cpu", torch.float32, TritonAttentionBackend())
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ours, hf


def test_chunked_prefill_and_decode_match_transformers(models) -> None:
    ours, hf = models
    prompts = [list(range(3, 40)), [7, 8, 9], list(range(50, 71))]
    session = PagedSession(ours, page_size=16, max_total_tokens=512, max_context=64)
    reqs, logits = session.prefill(prompts, chunk=16)
    steps = [logits]
    sequences = [list(p) for p in prompts]
    for _ in range(4):
        nxt = steps[-1].argmax(-1).tolist()
        for seq, tok in zip(sequences, nxt, strict=True):
            seq.append(tok)
        steps.append(ours.forward(session.decode_batch(reqs, nxt)))
    with torch.inference_mode():
        for i, seq in enumerate(sequences):
            reference = hf(torch.tensor([seq])).logits[0].float()
            n = len(prompts[i])
            for step, got in enumerate(steps):
                torch.testing.assert_close(got[i], reference[n - 1 + step], atol=1e-4, rtol=1e-4)
