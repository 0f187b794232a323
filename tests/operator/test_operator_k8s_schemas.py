"""Every object the builders produce, for a matrix of specs, is valid Kubernetes 1.30
(kubernetes-validate, strict: unknown fields are errors)."""

from __future__ import annotations

import kubernetes_validate
import pytest
from operator_testkit import SPEC_MATRIX
from operator_validators import k8s_validate

from sluice.operator.children import plan


@pytest.mark.parametrize("spec", [s for _, s in SPEC_MATRIX], ids=[i for i, _ in SPEC_MATRIX])
def test_every_child_is_valid_kubernetes(make_spec, spec):
    children = plan(make_spec(**spec), podmonitors=True).apply

    assert {obj["kind"] for obj in children} >= {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
    }
    for obj in children:
        if obj["kind"] == "PodMonitor":
            continue  # not a built-in kind: no schema in kubernetes-validate (its shape is unit-tested)
        k8s_validate(obj)


def test_the_validation_is_strict_enough_to_fail(make_spec):
    deployment = plan(make_spec(), podmonitors=None).apply[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["port"] = {
        "name": "http"
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(deployment)

    deployment = plan(make_spec(), podmonitors=None).apply[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGets"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(deployment)


def test_the_saturation_hpa_is_valid_kubernetes(make_spec):
    isvc = make_spec(autoscaling={"enabled": True, "policy": "saturation", "minReplicas": 2})
    (hpa,) = [o for o in plan(isvc, podmonitors=None, run_as_user=None).apply
              if o["kind"] == "HorizontalPodAutoscaler"]  # fmt: skip
    k8s_validate(hpa)
    assert hpa["spec"]["metrics"][0]["type"] == "External"


def test_every_new_pod_option_is_valid_kubernetes(make_spec):
    isvc = make_spec(
        model={"source": "hf://org/m-GGUF", "files": ["m-q4.gguf"], "cache": {"claimName": "hub"}},
        resources={"gpus": 2, "shmSize": "4Gi", "memory": "64Gi"},
        serviceAccountName="inference",
        imagePullSecrets=[{"name": "regcred"}],
        podMetadata={"labels": {"team": "ml"}, "annotations": {"example.com/owner": "ml"}},
        networkPolicy={"enabled": True, "allowedNamespaces": ["apps"]},
        scheduling={
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "chat"}},
                }
            ]
        },
        autoscaling={"enabled": True, "minReplicas": 2},
    )
    children = plan(isvc, podmonitors=None, run_as_user=None).apply
    assert {obj["kind"] for obj in children} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy",
    }  # fmt: skip
    for obj in children:
        k8s_validate(obj)
