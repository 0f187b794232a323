"""GPU checks (`scripts/gpu_check.sh` runs them on an NVIDIA GPU); skipped without CUDA.

The CPU suite turns Triton's interpreter on (`tests/conftest.py`, unless TRITON_INTERPRET is
already set), which would turn the compiled kernels off: run them with TRITON_INTERPRET=0.

`SLUICE_GPU_TESTS_DEVICE=cpu` runs what can run on the CPU (torch and Triton under the
interpreter, fp32, smaller shapes) to check the tests themselves; FlashInfer cases skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from gpu_support import ON_CPU

if ON_CPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    skip = None
    if not ON_CPU and not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs a CUDA device")
    elif not ON_CPU and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        skip = pytest.mark.skip(reason="TRITON_INTERPRET is on: run tests/gpu with TRITON_INTERPRET=0")
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.gpu)
            if skip is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device() -> str:
    return "cpu" if ON_CPU else "cuda"


@pytest.fixture(scope="session")
def dtype() -> torch.dtype:
    return torch.float32 if ON_CPU else torch.bfloat16


@pytest.fixture(scope="session")
def gpu_model_path() -> Path:
    """The model folder `scripts/gpu_check.sh` prepared (SmolLM2, or SmolLM2-shaped)."""
    path = os.environ.get("SLUICE_GPU_MODEL")
    if not path:
        pytest.skip("SLUICE_GPU_MODEL is not set (scripts/gpu_check.sh sets it)")
    return Path(path)
