"""An adapter's base model is matched by the model's modules and their shapes: the name in
its `base_model_name_or_path` (a hub id, a training machine's folder) does not decide, and
an HF cache snapshot folder is known by its hub id."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from lora_adapters import make_adapter  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402

from sluice.runtime.attention.registry import create_model_backend  # noqa: E402
from sluice.runtime.lora.adapter import load_adapter  # noqa: E402
from sluice.runtime.lora.layout import model_lora_layout  # noqa: E402
from sluice.runtime.lora.manager import base_model_names, hub_id_names  # noqa: E402
from sluice.runtime.lora.spec import LoraAdapterError  # noqa: E402
from sluice.runtime.model.loader import load_model  # noqa: E402

SNAPSHOT = "/root/.cache/huggingface/hub/models--Qwen--Qwen3-0.6B/snapshots/c1899de289a04d12"


def test_an_hf_cache_snapshot_is_known_by_its_hub_id():
    assert hub_id_names(SNAPSHOT) == {"Qwen/Qwen3-0.6B", "Qwen3-0.6B"}
    assert hub_id_names("/models/plain") == set()
    names = base_model_names(SNAPSHOT, SNAPSHOT, "c1899de289a04d12")
    assert {"qwen/qwen3-0.6b", "qwen3-0.6b"} <= names


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    folder = make_tiny_llama(tmp_path_factory.mktemp("base") / "tiny-llama")
    model, _ = load_model(folder, "cpu", torch.float32, create_model_backend("torch", "cpu"))
    return folder, model_lora_layout(model)


def test_an_adapter_naming_another_base_loads_when_its_shapes_fit(base, tmp_path, caplog):
    folder, layout = base
    adapter = make_adapter(folder, tmp_path / "a", rank=4)
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    cfg["base_model_name_or_path"] = "Qwen/Qwen3-0.6B"  # trained on the hub id, say
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.WARNING, logger="sluice.runtime.lora.adapter"):
        weights = load_adapter("a", adapter, layout, 16, {"tiny-llama"})
    assert weights.rank == 4 and weights.base_model == "Qwen/Qwen3-0.6B"
    assert "Qwen/Qwen3-0.6B" in caplog.text


def test_an_adapter_of_another_models_shapes_is_refused(base, tmp_path):
    folder, layout = base
    other = make_tiny_llama(tmp_path / "wider", hidden_size=96)
    adapter = make_adapter(other, tmp_path / "b", rank=4)
    with pytest.raises(LoraAdapterError, match="shape"):
        load_adapter("b", adapter, layout, 16, {"tiny-llama"})
