import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # http_fakes.py, tests/tiny_model.py

from http_fakes import FakeTM  # noqa: E402
from tiny_model import make_tokenizer  # noqa: E402

from sluice.runtime.entrypoints.http_server import build_app  # noqa: E402
from sluice.runtime.server_args import ServerArgs  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture
def tm(tokenizer):
    return FakeTM(tokenizer)


@pytest.fixture
def client(tm):
    with TestClient(build_app(tm, ServerArgs(model="/models/tiny"))) as c:
        yield c
