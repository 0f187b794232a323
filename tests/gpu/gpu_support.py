"""What the GPU tests share (a module of its own: several conftest.py files exist)."""

from __future__ import annotations

import os

import pytest

ON_CPU = os.environ.get("SLUICE_GPU_TESTS_DEVICE") == "cpu"


def backend_for(name: str, device: str, page_size: int = 1):
    """A fresh backend (FlashInfer cases skip where it cannot run)."""
    if name == "flashinfer":
        if device != "cuda":
            pytest.skip("FlashInfer needs a GPU")
        pytest.importorskip("flashinfer")
    from sluice.runtime.attention.registry import create_attention_backend

    return create_attention_backend(name, device, page_size=page_size)
