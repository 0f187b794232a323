"""The batched sampler against independent references: transformers' own logits
processors and warpers, and OpenAI's frequency/presence formula written out here."""

from __future__ import annotations

import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from sluice.runtime.engine.forward_input import SamplingInput
from sluice.runtime.engine.sampler import (
    TokenHistory,
    apply_penalties,
    device_uniforms,
    draw,
    sample,
    warp,
)
from sluice.runtime.ipc.messages import SamplingParams

VOCAB = 257

WARPER_CASES = [
    dict(temperature=0.7),
    dict(temperature=1.3, top_k=20),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.9, min_p=0.05),
    dict(temperature=0.6, top_k=50, top_p=0.9, min_p=0.02),
    dict(temperature=1.0, top_k=1),
    dict(temperature=2.0, top_p=0.3),
]


def hf_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """transformers' sampling distribution for one row: its warpers in generate()'s order."""
    scores = logits[None].clone()
    ids = torch.zeros(1, 1, dtype=torch.long)
    scores = TemperatureLogitsWarper(p.temperature)(ids, scores)
    if 0 < p.top_k < VOCAB:
        scores = TopKLogitsWarper(p.top_k)(ids, scores)
    if p.top_p < 1.0:
        scores = TopPLogitsWarper(p.top_p)(ids, scores)
    if p.min_p > 0:
        scores = MinPLogitsWarper(p.min_p)(ids, scores)
    return scores.softmax(-1)[0]


def random_logits(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    "case", WARPER_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items())
)
def test_each_warper_chain_gives_transformers_distribution(case):
    p = SamplingParams(**case)
    logits = random_logits(6, seed=len(str(case)))
    ours = warp(logits, [p] * 6).softmax(-1)
    for row in range(6):
        want = hf_probs(logits[row], p)
        assert torch.equal(ours[row] > 0, want > 0)  # the same kept set
        torch.testing.assert_close(ours[row], want, atol=1e-6, rtol=0)


def test_rows_with_different_parameters_in_one_batch_match_each_alone():
    params = [SamplingParams(**c) for c in WARPER_CASES]
    logits = random_logits(len(params), seed=3)
    ours = warp(logits, params).softmax(-1)
    for row, p in enumerate(params):
        torch.testing.assert_close(ours[row], hf_probs(logits[row], p), atol=1e-6, rtol=0)


def _history(sequences: list[list[int]]) -> TokenHistory:
    width = max(len(s) for s in sequences) + 3
    ids = torch.full((len(sequences), width), 7)  # junk past each row's length
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
    return TokenHistory(ids, torch.tensor([len(s) for s in sequences]))


def _row(p: SamplingParams, prompt_len: int) -> SamplingInput:
    return SamplingInput(p, prompt_len, None)


def test_repetition_penalty_matches_transformers_over_prompt_and_output():
    prompt, output = [3, 5, 5, 9], [11, 3, 40]
    logits = random_logits(1, seed=5)
    p = SamplingParams(repetition_penalty=1.3)
    ours = apply_penalties(logits.clone(), [_row(p, len(prompt))], _history([prompt + output]))
    want = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits.clone())
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("freq,pres", [(0.8, 0.0), (0.0, 1.1), (-1.0, 0.4), (1.5, -0.5)])
def test_frequency_and_presence_follow_openais_formula_on_output_tokens(freq, pres):
    prompt, output = [4, 4, 8], [8, 12, 12, 12, 30]
    logits = random_logits(1, seed=int(10 * freq + 100 * pres))
    p = SamplingParams(frequency_penalty=freq, presence_penalty=pres)
    ours = apply_penalties(logits.clone(), [_row(p, len(prompt))], _history([prompt + output]))
    # OpenAI: mu[j] - c[j] * alpha_frequency - float(c[j] > 0) * alpha_presence, where c[j]
    # counts token j in what the model generated (the prompt does not count)
    want = logits.clone()
    for j in range(VOCAB):
        c = output.count(j)
        want[0, j] -= c * freq + (1.0 if c > 0 else 0.0) * pres
    torch.testing.assert_close(ours, want, atol=1e-6, rtol=0)


def test_penalties_of_several_rows_use_each_rows_own_history():
    histories = [[1, 2, 3, 3], [5, 6], [9, 9, 9, 1, 2]]
    prompt_lens = [2, 1, 3]
    params = [
        SamplingParams(repetition_penalty=1.2, frequency_penalty=0.5),
        SamplingParams(presence_penalty=0.7),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.3, presence_penalty=0.2),
    ]
    logits = random_logits(3, seed=9)
    rows = [_row(p, n) for p, n in zip(params, prompt_lens, strict=True)]
    ours = apply_penalties(logits.clone(), rows, _history(histories))
    for i, (p, h, n) in enumerate(zip(params, histories, prompt_lens, strict=True)):
        alone = apply_penalties(logits[i : i + 1].clone(), [rows[i]], _history([h]))
        torch.testing.assert_close(ours[i : i + 1], alone, atol=0, rtol=0)
        want = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)(
            torch.tensor([h]), logits[i : i + 1].clone()
        )
        out = h[n:]
        for j in set(out):
            want[0, j] -= out.count(j) * p.frequency_penalty + p.presence_penalty
        torch.testing.assert_close(ours[i : i + 1], want, atol=1e-6, rtol=0)


def test_a_draw_is_the_inverse_cdf_of_the_rows_own_uniform():
    params = [SamplingParams(temperature=0.8, top_p=0.9), SamplingParams(temperature=1.2, top_k=30)]
    logits = random_logits(2, seed=11)
    probs = warp(logits, params).softmax(-1)
    seeds, counters = torch.tensor([123, 456]), torch.tensor([7, 8])
    u = device_uniforms(seeds, counters)
    picked = draw(probs, u)
    for row in range(2):
        p = hf_probs(logits[row], params[row])
        running, want = 0.0, None
        for j in range(VOCAB):  # the first token whose cumulative probability passes u
            running += p[j].item()
            if running > u[row].item():
                want = j
                break
        assert picked[row].item() == want
        assert p[want] > 0


def test_device_uniforms_are_uniform_and_depend_on_seed_and_position():
    """Kolmogorov-Smirnov against U(0, 1) over 20000 (seed, position) pairs, and no two
    neighbouring seeds or positions give the same stream."""
    seeds = torch.arange(200).repeat_interleave(100) * 7919 + 2**40
    counters = torch.arange(100).repeat(200)
    u = device_uniforms(seeds, counters).double().sort().values
    n = u.numel()
    ecdf = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = (ecdf - u).abs().max().item()
    assert ks < 1.63 / n**0.5  # the 1% critical value
    assert 0 < u.min() and u.max() < 1
    grid = device_uniforms(seeds, counters).view(200, 100)
    assert not torch.equal(grid[0], grid[1]) and not torch.equal(grid[:, 0], grid[:, 1])
    # lag-1 correlation along positions is that of independent draws
    a, b = grid[:, :-1].flatten().double(), grid[:, 1:].flatten().double()
    assert abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item()) < 0.03


def test_a_seeded_row_draws_the_same_token_whatever_shares_its_batch():
    logits = random_logits(3, seed=21)
    p = SamplingParams(temperature=1.5, seed=77)
    mine = SamplingInput(p, 1, torch.Generator().manual_seed(77))
    others = [SamplingInput(SamplingParams(temperature=0.9), 1, torch.Generator().manual_seed(s))
              for s in (1, 2)]  # fmt: skip
    alone = sample(logits[:1], [mine]).token_ids[0].item()
    for order in ([mine, *others], [others[0], mine, others[1]]):
        at = order.index(mine)
        batch = torch.cat([logits[1 : at + 1], logits[:1], logits[at + 1 :]]) if at else logits
        assert sample(batch, order).token_ids[at].item() == alone


def test_greedy_rows_take_the_argmax_and_banned_tokens_are_never_picked():
    logits = random_logits(3, seed=13)
    top = logits.argmax(-1)
    rows = [
        SamplingInput(SamplingParams(temperature=0.0), 1, None),
        SamplingInput(SamplingParams(temperature=0.0), 1, None, banned_ids=(int(top[1]),)),
        SamplingInput(
            SamplingParams(temperature=1.0, top_k=1),
            1,
            torch.Generator().manual_seed(0),
            banned_ids=(int(top[2]),),
        ),  # fmt: skip
    ]
    out = sample(logits, rows)
    assert out.token_ids[0] == top[0]
    second = logits[1].clone()
    second[top[1]] = float("-inf")
    assert out.token_ids[1] == second.argmax()
    third = logits[2].clone()
    third[top[2]] = float("-inf")
    assert out.token_ids[2] == third.argmax()


def test_logprobs_are_of_the_raw_distribution():
    logits = random_logits(2, seed=17)
    p = SamplingParams(temperature=0.0, logprobs=True, repetition_penalty=1.5)
    rows = [_row(p, 1), _row(p, 1)]
    out = sample(logits, rows, _history([[int(logits[0].argmax())] * 2, [1, 2]]))
    raw = torch.log_softmax(logits, -1)
    assert out.logprobs is not None
    for i in range(2):
        assert out.logprobs[i].item() == pytest.approx(raw[i, out.token_ids[i]].item(), abs=1e-6)
