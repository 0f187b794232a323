"""Fixtures for the router tests: a tiny model with a long context, and a `Fleet` of real
runtime servers and routers (see router_testkit.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE.parent, HERE.parent.parent, HERE):  # tests/, the repo root, tests/router
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from router_testkit import Fleet  # noqa: E402


@pytest.fixture(scope="session")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama with a 4096-token context: a request can be held open for
    thousands of decode steps by construction (max_tokens), far longer than a test needs."""
    from tiny_model import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-long"), max_position_embeddings=4096)


@pytest.fixture(scope="module")
def fleet(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    f = Fleet(long_model, tmp_path_factory.mktemp("fleet-logs"))
    try:
        yield f
    finally:
        f.close()
