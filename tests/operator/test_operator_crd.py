"""The CRD: identity, subresources, printer columns, and its schema against samples and
invalid objects (OpenAPI schema + CEL rules), in step with the operator's own rules."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from invalid_cases import INVALID_CASES
from operator_testkit import IMAGE, SAMPLES, isvc_object
from operator_validators import k8s_validate

from sluice.operator import constants as c
from sluice.operator.parsing import MANAGED_FLAGS, RESERVED_ENV, SpecError, parse_spec
from sluice.operator.pod_fields import RESERVED_POD_LABELS
from sluice.runtime import constants as rc


def version(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]


def spec_schema(crd: dict[str, Any]) -> dict[str, Any]:
    return version(crd)["schema"]["openAPIV3Schema"]["properties"]["spec"]


def samples() -> list[dict[str, Any]]:
    return [yaml.safe_load(path.read_text()) for path in SAMPLES]


def test_crd_is_a_valid_kubernetes_object(crd):
    k8s_validate(crd)


def test_crd_names_the_resource(crd):
    names = crd["spec"]["names"]
    assert crd["metadata"]["name"] == f"{c.PLURAL}.{c.GROUP}"
    assert (crd["spec"]["group"], version(crd)["name"], crd["spec"]["scope"]) == (
        c.GROUP,
        c.VERSION,
        "Namespaced",
    )
    assert (names["kind"], names["plural"]) == (c.KIND, c.PLURAL)
    assert names["shortNames"] == [c.SHORT_NAME]
    assert "isvc" not in names["shortNames"]  # KServe's


def test_crd_has_status_and_scale_subresources(crd):
    assert version(crd)["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }


def test_crd_prints_model_replicas_url_phase_and_age(crd):
    columns = {col["name"]: col["jsonPath"] for col in version(crd)["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.source"
    assert columns["Ready"] == ".status.readyReplicas"
    assert columns["Desired"] == ".status.desiredReplicas"
    assert columns["URL"] == ".status.url"
    assert columns["Phase"] == ".status.phase"
    assert columns["Age"] == ".metadata.creationTimestamp"


def _walk(schema: dict[str, Any], path: str = ""):
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from _walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural(crd):
    for path, node in _walk(version(crd)["schema"]["openAPIV3Schema"]):
        typed = "type" in node or node.get("x-kubernetes-int-or-string")
        assert typed, f"{path} has no type"


def test_every_spec_field_is_described(crd):
    for path, node in _walk(spec_schema(crd), ".spec"):
        if path.count(".") <= 3 and "[]" not in path and "{}" not in path:
            assert node.get("description"), f"{path} has no description"


def test_enums_match_the_runtime_and_operator_constants(crd):
    spec = spec_schema(crd)["properties"]
    runtime = spec["runtime"]["properties"]
    assert tuple(runtime["schedulePolicy"]["enum"]) == rc.SCHEDULE_POLICIES
    assert tuple(runtime["attentionBackend"]["enum"]) == rc.ATTENTION_BACKENDS
    assert tuple(runtime["dtype"]["enum"]) == rc.DTYPES
    metric = spec["autoscaling"]["properties"]["metrics"]["items"]["properties"]
    assert tuple(metric["type"]["enum"]) == c.METRIC_TYPES
    status = version(crd)["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert tuple(status["phase"]["enum"]) == c.PHASES


def test_the_default_autoscaling_metrics_are_the_operators(crd):
    """One default, in the CRD and in the operator (docs/autoscaling.md records the `sluice
    plan` run it comes from)."""
    metrics = spec_schema(crd)["properties"]["autoscaling"]["properties"]["metrics"]
    assert [(m["type"], m["target"]) for m in metrics["default"]] == list(c.DEFAULT_METRICS)


def test_cel_lists_match_the_operator(crd):
    spec = spec_schema(crd)["properties"]
    flags_rule = spec["runtime"]["properties"]["extraArgs"]["x-kubernetes-validations"][0]["rule"]
    env_rules = [rule["rule"] for rule in spec["env"]["items"]["x-kubernetes-validations"]]
    assert tuple(re.findall(r"'(--[a-z-]+)'", flags_rule)) == MANAGED_FLAGS
    env_rule = next(rule for rule in env_rules if " in [" in rule)
    assert tuple(re.findall(r"'([A-Z_]+)'", env_rule)) == RESERVED_ENV
    labels = spec["podMetadata"]["properties"]["labels"]["x-kubernetes-validations"][0]["rule"]
    assert tuple(re.findall(r"'([a-z./-]+)'", labels)) == RESERVED_POD_LABELS


def test_bounds_match_the_operator(crd):
    spec = spec_schema(crd)["properties"]
    assert spec["replicas"]["maximum"] == c.MAX_REPLICAS
    assert spec["resources"]["properties"]["gpus"]["maximum"] == c.MAX_GPUS
    assert (
        spec["runtime"]["properties"]["tensorParallelSize"]["maximum"] == c.MAX_TENSOR_PARALLEL_SIZE
    )
    assert spec["runtime"]["properties"]["extraArgs"]["maxItems"] == c.MAX_EXTRA_ARGS
    rule = version(crd)["schema"]["openAPIV3Schema"]["x-kubernetes-validations"][0]["rule"]
    assert f"<= {c.MAX_NAME_LENGTH}" in rule
    routed = version(crd)["schema"]["openAPIV3Schema"]["x-kubernetes-validations"][2]["rule"]
    assert f"<= {c.MAX_ROUTED_NAME_LENGTH}" in routed and "spec.router.enabled" in routed
    router = spec["router"]["properties"]
    assert router["replicas"]["maximum"] == c.MAX_ROUTER_REPLICAS
    assert router["replicas"]["default"] == c.DEFAULT_ROUTER_REPLICAS
    assert router["policy"]["default"] == c.DEFAULT_ROUTER_POLICY
    assert tuple(router["policy"]["enum"]) == rc.ROUTER_POLICIES
    picker = spec["inferencePool"]["properties"]["endpointPickerRef"]["properties"]
    assert tuple(picker["failureMode"]["enum"]) == c.EPP_FAILURE_MODES
    assert picker["port"]["default"] == c.DEFAULT_EPP_PORT


@pytest.mark.parametrize(
    "spec",
    [
        {"model": {"source": "bundled://smollm2-135m"}},
        {"model": {"source": "hf://org/m", "tokenSecretRef": {"name": "hf"}, "revision": "main"}},
        {"model": {"source": "pvc://models/m"}, "runtime": {"apiKeySecretRef": {"name": "key"}}},
        {"model": {"source": "bundled://smollm2-135m"}, "autoscaling": {"enabled": True}},
        {
            "model": {"source": "bundled://smollm2-135m"},
            "autoscaling": {"behavior": {"scaleDown": {}}},
        },
        {"model": {"source": "bundled://smollm2-135m"}, "resources": {"gpus": 2}},
        {"model": {"source": "bundled://smollm2-135m"}, "networkPolicy": {"enabled": True}},
        {"model": {"source": "bundled://smollm2-135m"}, "router": {"enabled": True}},
        {"model": {"source": "bundled://smollm2-135m"}, "inferencePool": {"enabled": True}},
        {
            "model": {"source": "bundled://smollm2-135m"},
            "inferencePool": {"enabled": True, "endpointPickerRef": {"name": "e"}},
        },
        {
            "model": {"source": "bundled://smollm2-135m"},
            "autoscaling": {"enabled": True, "policy": "saturation"},
        },
    ],
    ids=[
        "bundled",
        "hf",
        "pvc",
        "autoscaling",
        "behavior",
        "gpus-without-tp",
        "network-policy",
        "router",
        "inference-pool",
        "endpoint-picker",
        "saturation",
    ],  # fmt: skip
)
def test_crd_defaults_agree_with_the_operator_defaults(crd_validator, spec):
    obj = isvc_object()
    obj["spec"] = copy.deepcopy(spec)
    defaulted = crd_validator.default(obj)

    assert defaulted["spec"] != spec  # the CRD did fill something in
    assert parse_spec("chat", "default", defaulted["spec"], default_image=IMAGE) == parse_spec(
        "chat", "default", spec, default_image=IMAGE
    )


def test_samples_cover_cpu_gpu_and_autoscaling():
    specs = {s["metadata"]["name"]: s["spec"] for s in samples()}
    assert any(
        s["model"]["source"].startswith("bundled://") and not s.get("resources", {}).get("gpus")
        for s in specs.values()
    )
    assert any(s.get("resources", {}).get("gpus", 0) > 0 for s in specs.values())
    assert any(s.get("autoscaling", {}).get("enabled") for s in specs.values())


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_sample_is_valid_for_the_crd_and_the_operator(crd_validator, path):
    obj = yaml.safe_load(path.read_text())

    assert crd_validator.errors(obj) == []
    meta = obj["metadata"]
    parse_spec(meta["name"], meta.get("namespace", "default"), obj["spec"], default_image=IMAGE)


@pytest.mark.parametrize(
    ("case", "name", "spec", "message"), INVALID_CASES, ids=[c[0] for c in INVALID_CASES]
)
def test_invalid_object_is_rejected_by_the_crd_and_the_operator(
    crd_validator, case, name, spec, message
):
    obj = isvc_object(name)
    obj["spec"] = copy.deepcopy(spec)

    assert crd_validator.errors(obj), f"the CRD accepted {case}"
    with pytest.raises(SpecError):
        parse_spec(name, "default", spec, default_image=IMAGE)


def test_cel_rules_reject_what_the_schema_alone_allows(crd_validator):
    """These objects pass the OpenAPI schema; only the CEL rules catch them."""
    cross_field = {
        "tp": {"resources": {"gpus": 3}, "runtime": {"tensorParallelSize": 2}},
        "shm": {"resources": {"gpus": 1, "shmSize": "1Gi"}},
        "abbreviation": {"runtime": {"extraArgs": ["--por=8081"]}},
        "files-on-pvc": {"model": {"source": "pvc://m/x", "files": ["*.gguf"]}},
        "pod-label": {"podMetadata": {"labels": {"app.kubernetes.io/managed-by": "me"}}},
        "scaling": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
        "flags": {"runtime": {"extraArgs": ["--host=1.2.3.4"]}},
        "kv": {"autoscaling": {"metrics": [{"type": "kvTokenUsage", "target": 2}]}},
        "rollout": {"rollout": {"maxSurge": 0, "maxUnavailable": 0}},
    }
    for case, spec in cross_field.items():
        obj = isvc_object(**spec)
        assert crd_validator.schema_errors(obj) == [], case
        problems = crd_validator.errors(obj)
        assert problems, f"CEL accepted {case}"
        assert not any("failed to evaluate" in p for p in problems), problems


def test_a_valid_object_with_every_field_passes(crd_validator):
    obj = isvc_object(
        model={
            "source": "hf://org/m",
            "revision": "v1.0",
            "servedName": "m",
            "tokenSecretRef": {"name": "hf", "key": "t"},
            "storageSize": "20Gi",
            "files": ["*.safetensors", "*.json"],
            "cache": {"claimName": "hf-cache"},
        },
        image="img:1",
        replicas=2,
        resources={
            "gpus": 4,
            "gpuResource": "amd.com/gpu",
            "cpu": "500m",
            "memory": "8Gi",
            "shmSize": "8Gi",
        },
        runtime={
            "tensorParallelSize": 4,
            "pageSize": 16,
            "maxRunningRequests": 64,
            "chunkedPrefillSize": 4096,
            "schedulePolicy": "lpm",
            "overlapSchedule": False,
            "memFractionStatic": 0.8,
            "attentionBackend": "flashinfer",
            "dtype": "bfloat16",
            "apiKeySecretRef": {"name": "k"},
            "extraArgs": ["--max-prefill-tokens=8192"],
        },
        autoscaling={
            "enabled": True,
            "minReplicas": 2,
            "maxReplicas": 8,
            "metrics": [
                {"type": "queueDepth", "target": 4},
                {"type": "kvTokenUsage", "target": 0.75},
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 30,
                    "selectPolicy": "Max",
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 60}],
                }
            },
        },
        scheduling={
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "affinity": {"nodeAffinity": {}},
            "priorityClassName": "high",
            "runtimeClassName": "nvidia",
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "ScheduleAnyway",
                }
            ],  # fmt: skip
        },
        serviceAccountName="inference",
        imagePullSecrets=[{"name": "regcred"}],
        podMetadata={"labels": {"team": "ml"}, "annotations": {"example.com/a": "b"}},
        networkPolicy={
            "enabled": True,
            "allowedNamespaces": ["apps"],
            "monitoringNamespace": "obs",
        },
        router={
            "enabled": True,
            "replicas": 2,
            "policy": "least-load",
            "resources": {"cpu": "500m", "memory": "512Mi"},
        },
        inferencePool={
            "enabled": True,
            "endpointPickerRef": {"name": "shared-epp", "port": 9100, "failureMode": "FailOpen"},
        },
        env=[
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        startupTimeoutSeconds=3600,
        terminationGracePeriodSeconds=300,
    )

    assert crd_validator.errors(obj) == []
    parse_spec("chat", "default", obj["spec"], default_image=IMAGE)


def test_conditions_are_metav1_conditions(crd):
    """The status conditions have metav1.Condition's fields, required ones and bounds
    (kubectl, kstatus and Argo CD read them as such)."""
    import json
    import pathlib

    import jsonschema
    import kubernetes_validate

    from sluice.operator.status import Observed, compute_status

    schema_dir = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    definitions = json.loads((schema_dir / "v1.30.0-local" / "_definitions.json").read_text())
    metav1 = definitions["$defs"]["io.k8s.apimachinery.pkg.apis.meta.v1.Condition"]
    status = version(crd)["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    item = status["conditions"]["items"]
    assert item["required"] == metav1["required"]
    assert set(item["properties"]) == set(metav1["properties"])
    assert item["properties"]["lastTransitionTime"]["format"] == "date-time"
    # what the operator writes fits, reasons and all
    observed = Observed(name="chat", namespace="ml", generation=3, deployment=None)
    written = compute_status(observed, previous={}, now="2026-01-01T00:00:00Z",
                             cluster_domain="cluster.local")  # fmt: skip
    assert written["conditions"]
    for condition in written["conditions"]:
        jsonschema.Draft4Validator(item).validate(condition)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(item).validate({"type": "Ready", "status": "True"})
    with pytest.raises(jsonschema.ValidationError):
        bad_reason = {**written["conditions"][0], "reason": "not a reason"}
        jsonschema.Draft4Validator(item).validate(bad_reason)


def test_names_do_not_collide_with_kserve(crd):
    """KServe's InferenceService (serving.kserve.io) is `isvc`; ours is `sisvc`, in the
    `sluice` category only (not `all`)."""
    names = crd["spec"]["names"]
    assert names["shortNames"] == ["sisvc"] and names["categories"] == ["sluice"]


def test_the_crd_carries_the_schema_version_the_operator_was_built_for(crd):
    annotations = crd["metadata"]["annotations"]
    assert annotations[c.ANNOTATION_SCHEMA_VERSION] == str(c.CRD_SCHEMA_VERSION)


def test_an_older_served_crd_is_warned_about_at_start_up(crd, caplog):
    import asyncio
    import logging

    from sluice.operator.handlers import crd_event, crd_schema_warning

    assert crd_schema_warning(crd) is None
    old = copy.deepcopy(crd)
    old["metadata"]["annotations"][c.ANNOTATION_SCHEMA_VERSION] = "1"
    unversioned = copy.deepcopy(crd)
    del unversioned["metadata"]["annotations"]
    for served in (old, unversioned):
        assert "--force-conflicts" in crd_schema_warning(served)

    class Optional:
        def forget_discovery(self) -> None:
            pass

    class Controller:
        ctx = type("Ctx", (), {"optional": Optional()})()

    memo: dict[str, Any] = {"controller": Controller()}
    with caplog.at_level(logging.WARNING, logger="sluice.operator"):
        for _ in range(2):  # Kopf's first listing, then a change that left it old
            asyncio.run(crd_event(type=None, body=old, memo=memo, logger=logging.getLogger()))
    warnings = [r for r in caplog.records if "schema version 1" in r.getMessage()]
    assert len(warnings) == 1  # once, not at every event
