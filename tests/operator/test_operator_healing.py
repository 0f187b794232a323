"""The operator heals (end to end, as test_operator_kopf.py): every trigger runs one
reconcile, retried with back-off; deleted or edited children come back; blocked states
(a foreign object, a predecessor awaiting garbage collection) clear by themselves."""

from __future__ import annotations

import sys

import pytest
from kopf_testkit import (
    DEPLOYMENT,
    HPA,
    ISVC,
    NETWORKPOLICY,
    PDB,
    PODMONITOR,
    RESYNC_S,
    SERVICE,
    WAIT_S,
    condition,
    create,
    deployment_applies,
    events,
    get,
    report_replicas,
    status,
    wait_resynced,
)
from operator_cluster import PODMONITOR_INFO, PODMONITOR_RESOURCE, wait_for
from operator_testkit import IMAGE

# --- retries ------------------------------------------------------------------------------------


def test_transient_api_errors_are_retried(cluster, ns):
    cluster.fail("PATCH", f"/{ns}/deployments/chat", 503, times=2)
    create(cluster, ns, "chat")

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment after retries")
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Pending", what="status")
    assert deployment_applies(cluster, ns) >= 3


def test_a_transient_error_while_recreating_a_child_is_retried(cluster, ns):
    create(cluster, ns, "chat")
    first = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    cluster.fail("PATCH", f"/{ns}/deployments/chat", 503, times=2)

    cluster.delete(*DEPLOYMENT, ns, "chat")

    wait_for(
        lambda: (
            (d := get(cluster, DEPLOYMENT, ns, "chat"))
            and d["metadata"]["uid"] != first["metadata"]["uid"]
        ),
        what="the Deployment re-created after two 503s",
    )


def test_a_rejected_child_is_retried_at_the_resync_not_in_a_loop(cluster, ns):
    cluster.fail("PATCH", f"/{ns}/deployments/chat", 422)
    create(cluster, ns, "chat")

    wait_for(
        lambda: condition(cluster, ns, "chat", "Ready").get("reason") == "ApplyFailed",
        what="ApplyFailed",
    )
    assert status(cluster, ns, "chat")["phase"] == "Failed"
    wait_for(lambda: events(cluster, ns, "ApplyFailed"), what="an event")

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the resync to apply it again")
    rejected, accepted = [
        r for r in cluster.requests()
        if r["method"] == "PATCH" and r["path"].endswith(f"/{ns}/deployments/chat")
        and r["params"].get("fieldManager") == "sluice-operator"
    ][:2]  # fmt: skip
    assert (rejected["status"], accepted["status"]) == (422, 200)  # nothing in between
    assert accepted["time"] - rejected["time"] >= 0.5 * RESYNC_S  # it waited for the resync
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Pending", what="Failed cleared")


def test_a_foreign_object_blocks_until_it_is_gone(cluster, ns):
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "chat", "namespace": ns},
            "spec": {"ports": [{"port": 8080}]},
        }
    )
    create(cluster, ns, "chat")

    wait_for(
        lambda: condition(cluster, ns, "chat", "Ready").get("reason") == "NameConflict",
        what="NameConflict",
    )
    assert status(cluster, ns, "chat")["phase"] == "Failed"
    assert get(cluster, DEPLOYMENT, ns, "chat") is None
    assert get(cluster, SERVICE, ns, "chat")["spec"] == {"ports": [{"port": 8080}]}
    wait_for(lambda: events(cluster, ns, "NameConflict"), what="an event")

    cluster.delete(*SERVICE, ns, "chat")  # the owner fixes it: no spec change needed
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the children after the conflict")
    service = wait_for(lambda: get(cluster, SERVICE, ns, "chat"), what="our Service")
    assert service["metadata"]["ownerReferences"][0]["name"] == "chat"


def test_delete_and_recreate_while_garbage_collection_lags_converges(cluster, ns):
    create(cluster, ns, "chat")
    old = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    cluster.hold_gc()
    try:
        cluster.delete(*ISVC, ns, "chat")
        new = create(cluster, ns, "chat")  # kubectl delete -f x.yaml && kubectl apply -f x.yaml
        wait_for(
            lambda: (
                condition(cluster, ns, "chat", "Ready").get("reason")
                == "WaitingForGarbageCollection"
            ),
            what="waiting for the collector",
        )
        assert status(cluster, ns, "chat")["phase"] == "Pending"
        assert get(cluster, DEPLOYMENT, ns, "chat")["metadata"]["uid"] == old["metadata"]["uid"]
    finally:
        cluster.release_gc()

    deployment = wait_for(
        lambda: (
            (d := get(cluster, DEPLOYMENT, ns, "chat"))
            and d["metadata"]["ownerReferences"][0]["uid"] == new["metadata"]["uid"]
            and d
        ),
        what="children of the new InferenceService",
    )
    assert deployment["metadata"]["uid"] != old["metadata"]["uid"]
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Pending", what="converged")


# --- healing ------------------------------------------------------------------------------------

HEALED = {
    "Deployment": DEPLOYMENT,
    "Service": SERVICE,
    "HorizontalPodAutoscaler": HPA,
    "PodDisruptionBudget": PDB,
    "NetworkPolicy": NETWORKPOLICY,
    "PodMonitor": PODMONITOR,
}


@pytest.mark.parametrize("kind", list(HEALED))
def test_a_deleted_child_is_back_within_one_resync(cluster, ns, kind):
    what = HEALED[kind]
    if kind == "PodMonitor":
        cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    try:
        create(cluster, ns, "chat", autoscaling={"enabled": True}, networkPolicy={"enabled": True})
        first = wait_for(lambda: get(cluster, what, ns, "chat"), what=kind)

        cluster.delete(*what, ns, "chat")

        again = wait_for(
            lambda: (
                (c := get(cluster, what, ns, "chat"))
                and c["metadata"]["uid"] != first["metadata"]["uid"]
                and c
            ),
            timeout=RESYNC_S + WAIT_S,
            what=f"a new {kind}",
        )
        assert again["spec"] == first["spec"]
    finally:
        if kind == "PodMonitor":
            cluster.undeclare(PODMONITOR_RESOURCE)


def test_a_change_the_watch_missed_is_healed_by_the_resync(cluster, ns):
    create(cluster, ns, "chat")
    first = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    cluster.mute("deployments")  # the operator will not hear of the deletion
    try:
        cluster.delete(*DEPLOYMENT, ns, "chat")
        wait_for(
            lambda: (
                (d := get(cluster, DEPLOYMENT, ns, "chat"))
                and d["metadata"]["uid"] != first["metadata"]["uid"]
            ),
            timeout=RESYNC_S + WAIT_S,
            what="the resync to re-create the Deployment",
        )
    finally:
        cluster.unmute("deployments")


def test_an_edited_deployment_is_reverted(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    path = "/spec/template/spec/containers/0/image"
    cluster.patch(*DEPLOYMENT, ns, "chat", [{"op": "replace", "path": path, "value": "evil:1"}],
                  json_patch=True)  # fmt: skip

    wait_for(
        lambda: (
            get(cluster, DEPLOYMENT, ns, "chat")["spec"]["template"]["spec"]["containers"][0][
                "image"
            ]
            == IMAGE
        ),
        what="the image reverted",
    )


def test_deleting_the_service_leaves_nothing_behind(cluster, ns):
    create(cluster, ns, "chat", replicas=2, autoscaling={"enabled": True, "minReplicas": 2})
    for what in (DEPLOYMENT, SERVICE, HPA, PDB):
        wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=f"{what[1]}")
    wait_for(
        lambda: status(cluster, ns, "chat").get("observedGeneration") == 1,
        what="the reconcile to finish",
    )

    cluster.delete(*ISVC, ns, "chat")

    for what in (DEPLOYMENT, SERVICE, HPA, PDB):
        wait_for(lambda w=what: cluster.list(*w, ns) == [], what=f"{what[1]} collected")
    deletes = [
        r
        for r in cluster.requests()
        if r["method"] == "DELETE" and f"/namespaces/{ns}/" in r["path"]
    ]
    assert [r["path"].rsplit("/", 2)[-2] for r in deletes] == [
        "inferenceservices"
    ]  # GC did the rest


def test_a_resync_of_an_unchanged_service_writes_nothing(cluster, ns):
    create(cluster, ns, "chat", autoscaling={"enabled": True}, networkPolicy={"enabled": True})
    wait_for(lambda: get(cluster, HPA, ns, "chat"), what="the HPA")
    report_replicas(cluster, ns, "chat", replicas=1, available=1)
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Ready", what="Ready")
    wait_resynced(cluster, ns)  # everything before is done

    path = f"/namespaces/{ns}/inferenceservices/chat"
    mark = len(cluster.requests())
    wait_resynced(cluster, ns)
    calls = [r for r in cluster.requests()[mark:] if r["user_agent"].startswith("sluice-operator")]
    starts = [i for i, r in enumerate(calls) if r["method"] == "GET" and r["path"].endswith(path)]
    one_resync = calls[starts[0] : starts[1]]  # a whole fresh reconcile, nothing else

    assert [r for r in one_resync if r["method"] != "GET"] == []  # no apply, no status write
    reads = sorted({r["path"].rsplit("/", 2)[-2] for r in one_resync})
    print(f"\nAPI budget: one resync: {len(one_resync)} reads of {reads}", file=sys.__stdout__)
