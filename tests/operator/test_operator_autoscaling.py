"""Autoscaling on and off without losing a loaded pod (end to end, as
test_operator_kopf.py): the server-side-apply hand-over of Deployment.spec.replicas to the
HPA and back, on an emulator whose apply resets a released field to its default."""

from __future__ import annotations

from kopf_testkit import (
    DEPLOYMENT,
    HANDOVER,
    HPA,
    HPA_MANAGER,
    ISVC,
    condition,
    create,
    get,
    min_replicas_since,
    patch_spec,
    replicas_owners,
    report_replicas,
    report_rollout,
    status,
    wait_resynced,
)
from operator_cluster import wait_for

# --- replicas: autoscaling on and off without losing a pod ---------------------------------------


def test_autoscaling_takes_over_and_gives_back_the_replicas_without_a_drop(cluster, ns):
    create(cluster, ns, "chat", replicas=3)
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    report_rollout(cluster, ns, "chat", ready=3, conditions=[])
    start = len(cluster.history(*DEPLOYMENT, ns, "chat"))

    patch_spec(
        cluster, ns, "chat", {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 6}}
    )
    wait_for(lambda: get(cluster, HPA, ns, "chat"), what="the HPA")
    wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 2, what="applied")
    assert min_replicas_since(cluster, ns, start) == 3  # never reset to the default of 1
    wait_for(
        lambda: replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")) == {HANDOVER},
        what="the operator to hand replicas over",
    )

    # the HPA scales (through the scale subresource, as kube-controller-manager)
    cluster.patch(*DEPLOYMENT, ns, "chat", {"spec": {"replicas": 5}}, subresource="scale",
                  field_manager=HPA_MANAGER)  # fmt: skip
    assert replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")) == {HPA_MANAGER}
    wait_resynced(cluster, ns)  # a reconcile from a fresh read, after the scale's own
    assert get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 5  # left to the HPA
    assert replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")) == {HPA_MANAGER}

    start = len(cluster.history(*DEPLOYMENT, ns, "chat"))
    patch_spec(cluster, ns, "chat", {"autoscaling": {"enabled": False}})  # spec.replicas still 3
    wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
    wait_for(
        lambda: "sluice-operator" in replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")),
        what="the operator to own replicas again",
    )
    assert min_replicas_since(cluster, ns, start) == 5  # starts from the HPA's last count
    assert get(cluster, ISVC, ns, "chat")["spec"]["replicas"] == 5  # and says so in the spec


def test_autoscaling_turned_on_at_zero_replicas_starts_at_the_minimum(cluster, ns):
    create(cluster, ns, "chat", replicas=0)
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 0

    patch_spec(cluster, ns, "chat", {"autoscaling": {"enabled": True, "minReplicas": 2}})

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 2,
             what="the hand-over at minReplicas (an HPA never scales a target at 0)")  # fmt: skip
    assert replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")) == {HANDOVER}


def test_a_new_autoscaled_service_starts_at_its_minimum(cluster, ns):
    create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2})
    deployment = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert deployment["spec"]["replicas"] == 2


def ready_history(cluster, ns: str) -> list[str]:
    """The Ready condition's status in every stored version of the InferenceService."""
    result = []
    for version in cluster.history(*ISVC, ns, "chat"):
        conditions = ((version or {}).get("status") or {}).get("conditions") or []
        result += [c["status"] for c in conditions if c["type"] == "Ready"]
    return result


def test_ready_does_not_flap_while_the_autoscaler_scales_up(cluster, ns):
    create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    report_replicas(cluster, ns, "chat", replicas=2, available=2)
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Ready", what="Ready")
    served = len(ready_history(cluster, ns))

    cluster.patch(*DEPLOYMENT, ns, "chat", {"spec": {"replicas": 4}}, subresource="scale",
                  field_manager=HPA_MANAGER)  # fmt: skip
    report_replicas(cluster, ns, "chat", replicas=4, available=2)  # two new pods loading
    wait_for(
        lambda: condition(cluster, ns, "chat", "Progressing").get("reason") == "ReplicasStarting",
        what="the scale-up to show in Progressing",
    )
    assert status(cluster, ns, "chat")["phase"] == "Ready"
    assert status(cluster, ns, "chat")["desiredReplicas"] == 4
    report_replicas(cluster, ns, "chat", replicas=4, available=4)
    wait_for(
        lambda: condition(cluster, ns, "chat", "Progressing").get("reason") == "RolloutComplete",
        what="the scale-up done",
    )
    assert set(ready_history(cluster, ns)[served - 1 :]) == {"True"}  # never False in between
