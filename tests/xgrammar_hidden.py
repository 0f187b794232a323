"""Hide xgrammar from import for one test (the H200 image has none)."""

from __future__ import annotations

import sys

import pytest


def hide_xgrammar(monkeypatch: pytest.MonkeyPatch) -> None:
    """`import xgrammar` raises ImportError until the test ends."""
    for name in [m for m in sys.modules if m == "xgrammar" or m.startswith("xgrammar.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "xgrammar", None)
    with pytest.raises(ImportError):
        import xgrammar  # noqa: F401
