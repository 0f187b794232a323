"""values.yaml and values.schema.json: every value is commented and has a place in the
schema, and bad values are rejected before anything renders, with a message that names
the value and what is wrong with it."""

from __future__ import annotations

import json
import re

import helm_python as helm
import pytest
from chart_testkit import CHART_DIR, chart

SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())


def leaf_paths(values, prefix=()):
    """Dotted paths of every value in values.yaml (maps are walked; lists are leaves)."""
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            yield from leaf_paths(value, path)
        else:
            yield path


def schema_at(path):
    """The schema node for a values path; maps of free keys use `additionalProperties`."""
    node = SCHEMA
    for key in path:
        if key in node.get("properties", {}):
            node = node["properties"][key]
        else:
            node = node["additionalProperties"]
            assert isinstance(node, dict), f"{key} is not allowed by the schema"
        while "$ref" in node:
            target = SCHEMA
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            node = target
    return node


def test_every_value_has_a_place_in_the_schema():
    for path in leaf_paths(chart().values):
        assert schema_at(path), ".".join(path)


def test_schema_refuses_unknown_keys_everywhere():
    def closed(node, where):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, where
            for key, child in node["properties"].items():
                closed(child, f"{where}.{key}")

    closed(SCHEMA, "values")


def commented_paths(text):
    """Paths of the keys in values.yaml that have a comment line right above them."""
    key = re.compile(r"^( *)([A-Za-z][\w.-]*):")
    stack: list[tuple[int, str]] = []
    commented = set()
    previous = ""
    for line in text.splitlines():
        match = key.match(line)
        if match:
            indent = len(match.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, match.group(2)))
            if previous.startswith("#"):
                commented.add(tuple(name for _, name in stack))
        if line.strip():
            previous = line.strip()
    return commented


def test_every_value_in_values_yaml_is_commented():
    """Each value, or the block it belongs to (such as `resources`), has a comment."""
    commented = commented_paths((CHART_DIR / "values.yaml").read_text())
    for path in leaf_paths(chart().values):
        prefixes = {path[:n] for n in range(1, len(path) + 1)}
        assert prefixes & commented, f"values.yaml: {'.'.join(path)} has no comment"


@pytest.mark.parametrize(
    "values, where, why",
    [
        ({"operator": {"logFormat": "xml"}}, "/operator/logFormat", "one of 'plain', 'full', 'json'"),
        ({"operator": {"podMonitors": "always"}}, "/operator/podMonitors", "one of 'auto', 'never'"),
        ({"operator": {"replicas": 2}}, "/operator/leaderElection/enabled", "must be true"),
        ({"operator": {"replicas": -1}}, "/operator/replicas", "minimum"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "/operator/watchNamespaces/0", "does not match pattern"),
        ({"operator": {"watchNamespaces": "team-a"}}, "/operator/watchNamespaces", "want array"),
        ({"operator": {"verbose": "yes"}}, "/operator/verbose", "want boolean"),
        ({"operator": {"healthPort": 80}}, "/operator/healthPort", "minimum"),
        ({"operator": {"retryDelaySeconds": 0}}, "/operator/retryDelaySeconds", "exclusiveMinimum"),
        ({"operator": {"image": {"pullPolicy": "Sometimes"}}}, "/operator/image/pullPolicy", "one of"),
        ({"runtime": {"image": {"tag": "has space"}}}, "/runtime/image/tag", "does not match pattern"),
        ({"runtime": {"image": {"digest": "sha256:abc"}}}, "/runtime/image/digest", "does not match pattern"),
        ({"monitoring": {"enabled": "true"}}, "/monitoring/enabled", "want boolean"),
        ({"monitoring": {"podMonitor": {"interval": "15 seconds"}}}, "/monitoring/podMonitor/interval", "does not match pattern"),
        ({"monitoring": {"prometheusRule": {"labels": {"release": 1}}}}, "/monitoring/prometheusRule/labels/release", "want string"),
        ({"monitoring": {"grafana": {"enabled": True}}}, "/monitoring", "additional properties 'grafana' not allowed"),
        ({"operatr": {}}, "", "additional properties 'operatr' not allowed"),
    ],
)  # fmt: skip
def test_schema_rejects_bad_values_with_a_clear_message(values, where, why):
    with pytest.raises(helm.HelmValuesError) as caught:
        chart().validate_schema(values)
    message = str(caught.value)
    assert f"at '{where}'" in message and why in message, message


def test_schema_accepts_the_documented_examples():
    chart().validate_schema(
        {
            "operator": {"replicas": 3, "leaderElection": {"enabled": True, "leaseName": "sluice-ha"}},
            "runtime": {"image": {"repository": "ghcr.io/acme/sluice-runtime", "tag": "0.1.0-cpu"}},
            "monitoring": {"enabled": True, "podMonitor": {"interval": "1m30s"}},
        }
    )
