"""Fixtures of the model tests: each tiny model variant next to transformers' own."""

from __future__ import annotations

import pytest
import torch
from model_harness import MOE_VARIANTS, VARIANTS, ModelPair, perturb_and_resave

from sluice.runtime.model.loader import load_model


@pytest.fixture(scope="session")
def model_pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelPair]:
    from transformers import AutoModelForCausalLM

    pairs = {}
    for name, make in {**VARIANTS, **MOE_VARIANTS}.items():
        folder = make(tmp_path_factory.mktemp(name))
        perturb_and_resave(folder, seed=len(pairs))
        model, config = load_model(folder, "cpu", torch.float32, attention_backend="torch")
        hf_model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        pairs[name] = ModelPair(name, folder, model, config, hf_model)
    return pairs


@pytest.fixture(params=[*VARIANTS, *MOE_VARIANTS])
def pair(request: pytest.FixtureRequest, model_pairs: dict[str, ModelPair]) -> ModelPair:
    return model_pairs[request.param]
