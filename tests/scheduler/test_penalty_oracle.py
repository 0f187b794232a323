"""Greedy decoding with penalties through the real scheduler equals a step-by-step reference
built from transformers' forward with the penalty formulas applied by hand, in both loops.

In the overlap loop a request's newest token is still in flight when the next batch is
built; the penalty must count it exactly once. Other requests share the batch so the
overlap loop really has tokens in flight.
"""

from __future__ import annotations

import functools

import pytest
import torch

PROMPT = [20, 21] * 6  # greedy repeats itself here, so the penalties change the output
NEW = 24
OTHERS = [[40 + i, 41, 42, 43 + i] for i in range(5)]

PENALTIES = [
    dict(frequency_penalty=-1.0),
    dict(frequency_penalty=0.3),
    dict(frequency_penalty=0.8, presence_penalty=0.5),
    dict(frequency_penalty=1.5),
    dict(presence_penalty=1.2),
    dict(repetition_penalty=1.4, frequency_penalty=0.2),
]


@pytest.fixture(scope="module")
def hf_model(tiny_llama_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_llama_path, dtype=torch.float32).eval()


@torch.inference_mode()
def reference(hf_model, prompt: list[int], n: int, rep=1.0, freq=0.0, pres=0.0) -> list[int]:
    ids, out = list(prompt), []
    for _ in range(n):
        logits = hf_model(torch.tensor([ids])).logits[0, -1].float()
        for j in set(ids):  # repetition (transformers): prompt and output tokens
            logits[j] = logits[j] / rep if logits[j] > 0 else logits[j] * rep
        for j in set(out):  # OpenAI: c[j] * frequency + (c[j] > 0) * presence, output only
            logits[j] -= out.count(j) * freq + pres
        token = int(torch.argmax(logits))
        ids.append(token)
        out.append(token)
    return out


def margins_ok(hf_model, prompt, tokens, rep, freq, pres, margin=1e-3) -> bool:
    """Every step's top-2 gap (after penalties) is wider than fp32 noise between models."""
    ids, out = list(prompt), []
    with torch.inference_mode():
        for t in tokens:
            logits = hf_model(torch.tensor([ids])).logits[0, -1].float()
            for j in set(ids):
                logits[j] = logits[j] / rep if logits[j] > 0 else logits[j] * rep
            for j in set(out):
                logits[j] -= out.count(j) * freq + pres
            top2 = logits.topk(2).values
            if float(top2[0] - top2[1]) < margin:
                return False
            ids.append(t)
            out.append(t)
    return True


@functools.cache
def checked_reference(hf_model, rep: float, freq: float, pres: float) -> list[int]:
    want = reference(hf_model, PROMPT, NEW, rep, freq, pres)
    assert want != reference(hf_model, PROMPT, NEW)  # the penalty changes what a user gets
    assert margins_ok(hf_model, PROMPT, want, rep, freq, pres)
    return want


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
@pytest.mark.parametrize(
    "penalty", PENALTIES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items())
)
def test_greedy_with_penalties_equals_transformers_step_by_step(
    make_harness, hf_model, overlap, penalty
):
    rep = penalty.get("repetition_penalty", 1.0)
    freq = penalty.get("frequency_penalty", 0.0)
    pres = penalty.get("presence_penalty", 0.0)
    want = checked_reference(hf_model, rep, freq, pres)
    h = make_harness(disable_overlap_schedule=not overlap, max_running_requests=8)
    for i, prompt in enumerate(OTHERS):
        h.submit(f"other{i}", prompt, max_new_tokens=NEW + 6, ignore_eos=True)
    h.submit("p", PROMPT, max_new_tokens=NEW, ignore_eos=True, **penalty)
    h.run_until_idle()
    assert h.outputs["p"] == want
    # in the overlap loop the penalised request really decoded with a token in flight
    assert any(t.num_decode >= 2 and "p" in t.rids for t in h.ticks)
