"""Rendering the Sluice chart offline (Helm's own Go SDK through helm-python-sdk) and
validating what it renders: built-in kinds against the Kubernetes 1.30 schemas, the
Prometheus Operator's and Kopf's kinds against schemas written here."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "sluice"
RELEASE = "sluice"
NAMESPACE = "sluice-system"
K8S_VERSION = "1.30"

# The value sets the tests render. ALL_ON turns on every optional feature at once.
DEFAULTS: dict[str, Any] = {}
ALL_ON: dict[str, Any] = {
    "monitoring": {
        "enabled": True,
        "podMonitor": {"labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"labels": {"release": "kube-prometheus-stack"}},
        "grafanaDashboard": {"annotations": {"grafana_folder": "Sluice"}},
    },
    "operator": {
        "replicas": 2,
        "leaderElection": {"enabled": True},
        "verbose": True,
        "logFormat": "json",
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "high-priority",
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "podAnnotations": {"example.com/team": "ml"},
        "podLabels": {"team": "ml"},
        "extraEnv": [{"name": "TZ", "value": "UTC"}],
    },
    "serviceAccount": {"annotations": {"example.com/role": "sluice"}},
}
NAMESPACED_ALL_ON: dict[str, Any] = {
    **ALL_ON,
    "operator": {**ALL_ON["operator"], "watchNamespaces": ["team-a", "team-b"]},
}

# kubernetes-validate re-reads its definitions on every call; they never change.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)


@functools.cache
def chart() -> helm.Chart:
    return helm.Chart.load(CHART_DIR)


def render(values: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Template path → rendered text, as `helm template` would produce it."""
    return chart().render(dict(values or {}), name=RELEASE, namespace=NAMESPACE)


def render_objects(values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders (templates only; crds/ is in `crd_objects`)."""
    objects = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def crd_objects() -> list[dict[str, Any]]:
    """The CRDs under crds/, which Helm installs before the templates and never renders."""
    return [doc for crd in chart().crds for doc in yaml.safe_load_all(crd["data"]) if doc]


def notes(values: Mapping[str, Any] | None = None) -> str:
    return next(text for path, text in render(values).items() if path.endswith("NOTES.txt"))


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict]:
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]


def plain_env(container: Mapping[str, Any]) -> dict[str, str]:
    """The container's literal environment variables (valueFrom ones left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


# --- validation ------------------------------------------------------------------------

# Kinds whose schema is not part of Kubernetes: the Prometheus Operator's (not installed
# here; the fields the chart sets, checked strictly against the monitoring.coreos.com/v1
# API reference).
_META = {
    "type": "object",
    "required": ["name", "namespace", "labels"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}  # fmt: skip
PODMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        }
                    },
                },
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                        },
                    },
                },
            },
        },
    },
}
PROMETHEUSRULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": _META,
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "rules": {
                                "type": "array",
                                "minItems": 1,
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string", "minLength": 1},
                                        "record": {"type": "string", "minLength": 1},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": _DURATION,
                                        "keep_firing_for": _DURATION,
                                        "labels": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                        "annotations": {
                                            "type": "object",
                                            "additionalProperties": {"type": "string"},
                                        },
                                    },
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}


def validate(obj: Mapping[str, Any]) -> None:
    """Validate one rendered object like `kubectl apply --validate=strict` would."""
    kind = obj["kind"]
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        schema = {"PodMonitor": PODMONITOR_SCHEMA, "PrometheusRule": PROMETHEUSRULE_SCHEMA}[kind]
        jsonschema.Draft7Validator(schema).validate(obj)
    else:
        kubernetes_validate.validate(dict(obj), K8S_VERSION, strict=True)


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())
