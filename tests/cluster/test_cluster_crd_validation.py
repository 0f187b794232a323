"""The CRD's schema and CEL rules as the real API server compiles and runs them, against the
project's own evaluation (`tests/operator/operator_validators.py`: jsonschema + cel-python)."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import pytest
import yaml
from cluster_kit import ISVC_PATH, REPO, Kube

sys.path.insert(0, str(REPO / "tests" / "operator"))
from invalid_cases import INVALID_CASES  # noqa: E402
from operator_testkit import SAMPLES, isvc_object, load_crd  # noqa: E402
from operator_validators import CrdValidator  # noqa: E402


def _rule_messages(schema: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations", []):
            found.add(rule.get("message", rule["rule"]))
        for value in schema.values():
            found |= _rule_messages(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= _rule_messages(value)
    return found


CRD = load_crd()
VALIDATOR = CrdValidator(CRD)
RULE_MESSAGES = _rule_messages(CRD["spec"]["versions"][0]["schema"])
NS = "crd-validation"


@pytest.fixture(scope="module")
def crd_ns(kube: Kube, chart_release: dict[str, Any]) -> str:
    """The chart's CRD is installed (Helm installs crds/ first); a namespace to try objects in."""
    return kube.create_namespace(NS)


def server_create(kube: Kube, obj: dict[str, Any]) -> tuple[int, Any]:
    """Create `obj` with dryRun=All and strict field validation (what `kubectl apply` does):
    the whole admission chain and validation run, nothing is stored."""
    return kube.try_request(
        "POST",
        ISVC_PATH.format(ns=NS) + "?dryRun=All&fieldValidation=Strict",
        obj,
    )


@pytest.mark.parametrize(
    ("case", "name", "spec", "message"), INVALID_CASES, ids=[c[0] for c in INVALID_CASES]
)
def test_the_server_refuses_every_invalid_spec_and_cel_python_agrees(
    kube: Kube, crd_ns: str, case: str, name: str, spec: dict[str, Any], message: str
):
    obj = isvc_object(name, NS)
    obj["spec"] = copy.deepcopy(spec)

    code, body = server_create(kube, obj)
    assert code in (400, 422), f"the API server accepted {case}: {code} {body}"
    server_text = json.dumps(body)
    problems = VALIDATOR.errors(obj)
    assert problems, f"the project's CRD evaluation accepted {case}; the server said {server_text}"

    if not VALIDATOR.schema_errors(obj):
        # a schema-valid object refused by the CEL rules or a list map's keys: the same
        # rules fail on both sides, and the server answers with each rule's own message
        ours = {m for m in RULE_MESSAGES if any(p.endswith(m) for p in problems)}
        theirs = {m for m in RULE_MESSAGES if json.dumps(m)[1:-1] in server_text}
        assert ours == theirs, f"{case}: cel-python {ours} vs the API server {theirs}"
        our_duplicates = {p.split(":")[0] for p in problems if "duplicate entries" in p}
        their_duplicates = {
            cause["field"].rsplit("[", 1)[0]
            for cause in body["details"]["causes"]
            if cause["reason"] == "FieldValueDuplicate"
        }
        assert our_duplicates == their_duplicates, f"{case}: {problems} / {server_text}"
        assert ours or our_duplicates, f"{case}: {problems} / {server_text}"


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_the_server_accepts_every_sample_and_defaults_it_as_the_project_does(
    kube: Kube, crd_ns: str, path
):
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["namespace"] = NS
    code, body = server_create(kube, obj)
    assert code == 200, body
    # CRD defaulting, persisted at write time: the server's defaults are the project's
    assert body["spec"] == VALIDATOR.default(obj)["spec"]
