"""The experts of a mixture-of-experts layer wait for nothing: no value read back from the
device, no op whose output size depends on device data (tests/sync_recorder.py, a CUDA
stand-in on the CPU). A host sync in every layer's forward stalls the GPU's queue and makes
CUDA-graph capture fail; gpt-oss had one (`torch.unique(...).tolist()`).

Both run the grouped path (`torch._grouped_mm`), the one CUDA takes where Triton is absent."""

from __future__ import annotations

import pytest
import torch
from sync_recorder import recording
from tiny_model import make_tiny_qwen3_moe
from tiny_windowed import make_tiny_windowed

from sluice.runtime.attention.registry import create_model_backend
from sluice.runtime.model.gpt_oss import GptOssExperts
from sluice.runtime.model.loader import load_model
from sluice.runtime.model.moe import MoE, grouped_mm_supports

pytestmark = pytest.mark.skipif(
    not grouped_mm_supports(torch.float32, "cpu"), reason="torch._grouped_mm lacks fp32 on the CPU"
)


def _experts(folder, kind: type) -> torch.nn.Module:
    model, _ = load_model(folder, "cpu", torch.float32, create_model_backend("torch", "cpu"))
    return next(m for m in model.modules() if isinstance(m, kind))


@pytest.mark.parametrize("family", ["gpt_oss", "qwen3_moe"])
def test_an_expert_layer_forward_waits_for_nothing(tmp_path, family):
    if family == "gpt_oss":
        layer = _experts(make_tiny_windowed(tmp_path / family, family), GptOssExperts)
    else:
        layer = _experts(make_tiny_qwen3_moe(tmp_path / family), MoE)
        layer.impl = "grouped"
    router = layer.router if family == "gpt_oss" else layer.gate
    x = torch.randn(7, router.weight.shape[1])  # made before recording: a device tensor
    expected = layer(x)  # once outside: gpt-oss decides its path on the first call
    with torch.no_grad(), recording() as rec:
        out = layer(x)
    assert rec.events == [], rec.counts()
    torch.testing.assert_close(out, expected)
