"""The scheduler tests' harness (the real scheduler and model worker, tick by tick)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "scheduler_harness", Path(__file__).resolve().parents[1] / "scheduler" / "conftest.py"
)
assert _spec is not None and _spec.loader is not None
_harness = importlib.util.module_from_spec(_spec)
sys.modules["scheduler_harness"] = _harness
_spec.loader.exec_module(_harness)
make_harness = _harness.make_harness
Harness = _harness.Harness
