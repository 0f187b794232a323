"""Fixtures for the operator tests (helpers live in operator_testkit.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from operator_testkit import IMAGE, isvc_object, load_crd
from operator_validators import CrdValidator

from sluice.operator.parsing import parse_spec
from sluice.operator.spec import InferenceServiceSpec


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return load_crd()


@pytest.fixture(scope="session")
def crd_validator(crd: dict[str, Any]) -> CrdValidator:
    return CrdValidator(crd)


@pytest.fixture
def make_spec() -> Callable[..., InferenceServiceSpec]:
    def make(name: str = "chat", namespace: str = "default", **spec: Any) -> InferenceServiceSpec:
        obj = isvc_object(name, namespace, **spec)
        return parse_spec(name, namespace, obj["spec"], default_image=IMAGE)

    return make
