"""The step-time model: the NNLS solver against its optimality conditions, the fit against
costs generated from known coefficients, and the file round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sluice.runtime.engine.batch_features import BatchFeatures
from sluice.runtime.sim.calibration import Calibration, ModelFacts, Startup
from sluice.runtime.sim.cost_model import (
    FitError,
    LinearCost,
    LoopCost,
    StepCostModel,
    fit_forward,
    fit_linear,
    term_value,
)
from sluice.runtime.sim.nnls import nnls


@pytest.mark.parametrize("seed", range(20))
def test_nnls_meets_the_kkt_conditions(seed):
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(5, 40)), int(rng.integers(1, 7))
    a = rng.normal(size=(m, n)) * 10 ** rng.uniform(-5, 5, size=n)
    b = rng.normal(size=m)
    x = nnls(a, b)
    w = a.T @ (b - a @ x)  # minus the gradient of ||ax - b||^2 / 2
    scale = np.abs(a).max(axis=0) * np.abs(b).max() * m
    assert (x >= 0).all()
    assert (w <= 1e-6 * scale).all()  # no descent direction into the feasible set
    assert (np.abs(w[x > 0]) <= 1e-6 * scale[x > 0]).all()  # stationary where free


def test_nnls_equals_least_squares_when_that_is_non_negative():
    rng = np.random.default_rng(3)
    a = rng.uniform(0.5, 2.0, size=(30, 4))
    x_true = np.array([0.5, 1.0, 2.0, 0.1])
    b = a @ x_true + rng.normal(scale=1e-3, size=30)
    assert np.allclose(nnls(a, b), np.linalg.lstsq(a, b, rcond=None)[0], atol=1e-9)


def feats(rng: np.random.Generator) -> BatchFeatures:
    decode = int(rng.integers(0, 64))
    prefill_rows = int(rng.integers(0, 3)) if decode else int(rng.integers(1, 4))
    tokens = int(rng.integers(1, 1500)) if prefill_rows else 0
    return BatchFeatures(
        decode_rows=decode,
        decode_context=decode * int(rng.integers(20, 900)),
        prefill_rows=prefill_rows,
        prefill_tokens=tokens,
        prefill_attention_k=tokens * float(rng.uniform(10, 600)) / 1000,
        sampled_rows=decode + prefill_rows,
    )


def test_the_forward_fit_recovers_the_coefficients_that_made_the_costs():
    rng = np.random.default_rng(0)
    truth = LinearCost(("one", "tokens", "decode_context_k", "prefill_attention_k", "sampled_rows",
                        "decode_rows", "tokens_over:128"), (0.02, 0.0004, 0.003, 0.0015, 0.0002, 0.0, 0.0003))  # fmt: skip
    points = [feats(rng) for _ in range(300)]
    seconds = [truth.predict(f) for f in points]
    fitted = fit_forward(points, seconds)
    assert "tokens_over:128" in fitted.terms  # the knee that made the data
    assert FitError.of(fitted, points, seconds).max < 1e-6
    for term, coef in zip(truth.terms, truth.coef, strict=True):
        assert fitted.coef[fitted.terms.index(term)] == pytest.approx(coef, abs=1e-9)


def test_the_fit_never_returns_a_negative_cost():
    rng = np.random.default_rng(1)
    points = [feats(rng) for _ in range(100)]
    # costs that fall with the decode rows: least squares would take a negative coefficient
    seconds = [max(1e-3, 0.05 + 0.0002 * f.tokens - 0.0005 * f.decode_rows) for f in points]
    cost = fit_linear(points, seconds, ("one", "tokens", "decode_rows"))
    assert min(cost.coef) >= 0
    assert all(cost.predict(f) >= 0 for f in points)


def test_terms_read_the_features():
    f = BatchFeatures(decode_rows=3, decode_context=1500, prefill_rows=1, prefill_tokens=200,
                      prefill_attention_k=20.1, sampled_rows=4)  # fmt: skip
    assert term_value("tokens", f) == 203
    assert term_value("tokens_over:100", f) == 103
    assert term_value("tokens_over:500", f) == 0
    assert term_value("decode_context_k", f) == 1.5
    with pytest.raises(ValueError, match="unknown cost term"):
        LinearCost(("nope",), (1.0,))


def test_a_calibration_file_round_trips(tmp_path):
    loop = LoopCost(LinearCost(("one", "tokens"), (0.01, 1e-4)), LinearCost.constant(1e-4), LinearCost.constant(5e-5))
    cal = Calibration(
        ModelFacts("m", 1000, [2], 4096, 2048, "cpu", "bfloat16", "cpu", 2),
        {"dtype": "auto"}, 10000, StepCostModel({"normal": loop, "overlap": loop}), Startup(1, 2, 3),
        {"normal": {"forward": {"held_out": {"mean": 0.1}}}}, {"cpu": "x"}, 12.0,
    )  # fmt: skip
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    assert json.loads(path.read_text())["startup"]["total_s"] == 6


def test_a_bad_calibration_file_is_refused_with_its_reason(tmp_path):
    with pytest.raises(ValueError, match="run `sluice calibrate` first"):
        Calibration.load(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text('{"format_version": 99}')
    with pytest.raises(ValueError, match="rerun `sluice calibrate`"):
        Calibration.load(tmp_path / "x.json")


def test_cost_flags_must_match_but_resolved_values_agree():
    cal = Calibration(ModelFacts("m", 1000, [2], 4096, 2048, "cpu", "bfloat16", "cpu", 2),
                      {"dtype": "auto", "quantization": "none", "attention_backend": "auto"}, 1,
                      StepCostModel({}), Startup(0, 0, 0))  # fmt: skip
    assert cal.mismatched_flags({"dtype": "bfloat16", "attention_backend": "cpu"}) == []
    assert cal.mismatched_flags({"quantization": "w8a8"}) == ["--quantization 'w8a8' (calibrated with 'none')"]


def test_the_experts_term_counts_the_experts_a_batch_activates():
    from sluice.runtime.sim.cost_model import experts_term, term_value

    term = experts_term(8, 2)
    one = term_value(term, BatchFeatures(decode_rows=1))
    assert one == pytest.approx(2.0)  # one token: its own top-k
    assert term_value(term, BatchFeatures(decode_rows=2)) == pytest.approx(8 * (1 - 0.75**2))
    assert term_value(term, BatchFeatures(prefill_rows=1, prefill_tokens=500)) == pytest.approx(8.0)


def test_a_moe_forward_is_fitted_with_its_experts_term():
    from sluice.runtime.sim.cost_model import experts_term, term_value

    term = experts_term(16, 2)
    points = [BatchFeatures(decode_rows=b, decode_context=b * 100, sampled_rows=b) for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)]
    points += [BatchFeatures(prefill_rows=1, prefill_tokens=n, prefill_attention_k=n * n / 2000, sampled_rows=1)
               for n in (16, 64, 128, 256, 512)]  # fmt: skip
    seconds = [0.002 + 0.0005 * term_value(term, f) + 0.00002 * f.tokens for f in points]
    fitted = fit_forward(points, seconds, experts=(16, 2))
    assert term in fitted.terms
    assert fitted.coef[fitted.terms.index(term)] == pytest.approx(0.0005, rel=0.05)
    assert max(abs(fitted.predict(f) - s) / s for f, s in zip(points, seconds, strict=True)) < 0.02
