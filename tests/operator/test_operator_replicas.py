"""Who applies Deployment.spec.replicas (replicas.py), decided from the Deployment's
managedFields as a real API server writes them."""

from __future__ import annotations

from typing import Any

from sluice.operator.replicas import ReplicasPlan, decide, field_owners


def deployment(replicas: int, *owners: str, spec_replicas: str | None = None) -> dict[str, Any]:
    managed = [
        {"manager": name, "operation": "Apply" if name.startswith("sluice") else "Update",
         "fieldsV1": {"f:spec": {"f:replicas": {}, **({} if name != "sluice-operator" else {"f:template": {}})}}}
        for name in owners
    ]  # fmt: skip
    managed.append({"manager": "sluice-operator", "operation": "Apply",
                    "fieldsV1": {"f:spec": {"f:template": {}}}})  # fmt: skip
    meta: dict[str, Any] = {"managedFields": managed}
    if spec_replicas is not None:
        meta["annotations"] = {"sluice.dev/spec-replicas": spec_replicas}
    return {"metadata": meta, "spec": {"replicas": replicas}}


ON = {"autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6}}
HANDOVER = "sluice-operator-replicas-handover"
HPA = "kube-controller-manager"


def test_field_owners_read_managed_fields():
    dep = deployment(3, "sluice-operator", HANDOVER)
    assert field_owners(dep, "spec", "replicas") == {"sluice-operator", HANDOVER}
    assert field_owners(dep, "spec", "template") == {"sluice-operator"}
    assert field_owners(None, "spec") == set()


def test_without_autoscaling_the_spec_count_is_applied(make_spec):
    assert decide(make_spec(replicas=3), None, hpa_exists=False) == ReplicasPlan(3)
    drifted = deployment(5, "kubectl")  # someone scaled the Deployment by hand
    assert decide(make_spec(replicas=3), drifted, hpa_exists=False) == ReplicasPlan(3)


def test_turning_autoscaling_on_hands_the_current_count_over(make_spec):
    dep = deployment(3, "sluice-operator", spec_replicas="3")
    assert decide(make_spec(replicas=3, **ON), dep, hpa_exists=False) == ReplicasPlan(
        None, handover=3
    )


def test_autoscaling_turned_on_at_zero_replicas_hands_over_the_minimum(make_spec):
    dep = deployment(0, "sluice-operator", spec_replicas="0")
    assert decide(make_spec(replicas=0, **ON), dep, hpa_exists=False) == ReplicasPlan(
        None, handover=2
    )  # the HPA never scales a target at 0
    # a hand-over at 0 left by an older operator is raised too
    stuck = deployment(0, HANDOVER, spec_replicas="0")
    assert decide(make_spec(replicas=0, **ON), stuck, hpa_exists=True) == ReplicasPlan(
        None, handover=2
    )


def test_a_count_handed_over_is_not_applied_again(make_spec):
    dep = deployment(3, HANDOVER, spec_replicas="3")
    assert decide(make_spec(replicas=3, **ON), dep, hpa_exists=True) == ReplicasPlan(None)


def test_once_the_hpa_owns_the_count_the_operator_leaves_it(make_spec):
    dep = deployment(4, HPA)
    assert decide(make_spec(**ON), dep, hpa_exists=True) == ReplicasPlan(None)


def test_a_new_autoscaled_deployment_starts_within_bounds(make_spec):
    assert decide(make_spec(replicas=1, **ON), None, hpa_exists=False) == ReplicasPlan(2)


def test_turning_autoscaling_off_keeps_the_autoscalers_count(make_spec):
    dep = deployment(5, HPA, spec_replicas="3")
    assert decide(make_spec(replicas=3), dep, hpa_exists=True) == ReplicasPlan(5, copy_to_spec=5)


def test_turning_autoscaling_off_with_a_new_count_uses_that_count(make_spec):
    dep = deployment(5, HPA, spec_replicas="3")
    assert decide(make_spec(replicas=2), dep, hpa_exists=True) == ReplicasPlan(2)


def test_turning_autoscaling_off_before_the_hpa_acted_releases_the_handover(make_spec):
    dep = deployment(3, "sluice-operator", HANDOVER, spec_replicas="3")
    assert decide(make_spec(replicas=3), dep, hpa_exists=True) == ReplicasPlan(
        3, release_handover=True
    )
