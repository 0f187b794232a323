import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests/tiny_model.py

from tiny_model import make_tokenizer  # noqa: E402


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()
