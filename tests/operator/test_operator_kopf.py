"""The operator end to end (Kopf's KopfRunner against the API emulator): what it creates,
how the status follows the children, what it writes (valid objects, exact RBAC).

One operator runs per test module (conftest.py: resync every RESYNC_S seconds, quick
back-off); each test has its own namespace, deleted at the end. The tests act as the user
(kubectl-like HTTP calls) and as the cluster's controllers, and assert on what the API
server ends up holding. An error the operator logs fails the test during which it
happened."""

from __future__ import annotations

import logging

import jsonschema
from kopf_testkit import (
    CRASH_LOOP,
    DEPLOYMENT,
    HANDOVER,
    HPA,
    INFERENCEPOOL,
    ISVC,
    NETWORKPOLICY,
    OLD_IMAGE,
    OPERATOR_AGENTS,
    PDB,
    PODMONITOR,
    RESYNC_S,
    ROLE,
    ROLEBINDING,
    SERVICE,
    SERVICEACCOUNT,
    WAIT_S,
    ErrorLog,
    as_an_older_operator_left_it,
    condition,
    create,
    deployment_applies,
    events,
    get,
    patch_spec,
    rbac_needs,
    replicas_owners,
    report_replicas,
    report_rollout,
    run_pod,
    runtime_container,
    status,
)
from operator_cluster import (
    INFERENCEPOOL_INFO,
    INFERENCEPOOL_RESOURCE,
    PODMONITOR_INFO,
    PODMONITOR_RESOURCE,
    wait_for,
)
from operator_testkit import IMAGE, load_crd
from operator_validators import k8s_validate

from sluice.operator import rbac
from sluice.operator.builders import build_deployment
from sluice.operator.parsing import parse_spec

# --- creating, updating, reporting --------------------------------------------------------------


def test_create_makes_owned_children_and_reports_status(cluster, ns):
    owner = create(cluster, ns, "chat", replicas=2, resources={"cpu": "1"})
    uid = owner["metadata"]["uid"]

    for what in (DEPLOYMENT, SERVICE, PDB):
        child = wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=f"{what[1]} to exist")
        assert child["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "sluice.dev/v1alpha1",
                "kind": "InferenceService",
                "name": "chat",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    assert get(cluster, HPA, ns, "chat") is None

    deployment = get(cluster, DEPLOYMENT, ns, "chat")
    expected = build_deployment(parse_spec("chat", ns, owner["spec"], default_image=IMAGE))
    assert deployment["spec"] == expected["spec"]

    final = wait_for(
        lambda: (
            status(cluster, ns, "chat").get("observedGeneration") == 1
            and status(cluster, ns, "chat")
        )
    )
    assert final["phase"] == "Pending"
    assert final["url"] == f"http://chat.{ns}.svc.cluster.local"
    assert (
        final["selector"] == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime"
    )
    assert final["servedModelName"] == "SmolLM2-135M-Instruct"
    assert final["image"] == IMAGE
    assert {c["type"] for c in final["conditions"]} == {
        "Ready",
        "Available",
        "Progressing",
        "Degraded",
        "OptionalResourcesAvailable",
    }
    optional = next(c for c in final["conditions"] if c["type"] == "OptionalResourcesAvailable")
    assert (optional["status"], optional["message"]) == (
        "True",
        "PodMonitor: API not served; InferencePool: API not served",
    )
    assert [e["message"] for e in events(cluster, ns, "Created")] == [
        f"Created {kind} {ns}/chat." for kind in ("Deployment", "Service", "PodDisruptionBudget")
    ]

    stored = get(cluster, ISVC, ns, "chat")
    assert not stored["metadata"].get("annotations")  # no Kopf bookkeeping on the object
    assert not stored["metadata"].get("finalizers")  # deleting never waits for the operator


def test_deployment_becoming_available_flips_ready(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert condition(cluster, ns, "chat", "Ready").get("status") != "True"

    report_rollout(cluster, ns, "chat", ready=0,
                   conditions=[{"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"}])  # fmt: skip
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Progressing", what="Progressing")

    report_rollout(
        cluster,
        ns,
        "chat",
        ready=1,
        conditions=[
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"},
        ],
    )
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Ready", what="Ready")
    assert condition(cluster, ns, "chat", "Ready")["status"] == "True"
    assert condition(cluster, ns, "chat", "Available")["reason"] == "ReplicasAvailable"
    assert status(cluster, ns, "chat")["readyReplicas"] == 1
    wait_for(lambda: events(cluster, ns, "Ready"), what="a Ready event")

    report_rollout(
        cluster,
        ns,
        "chat",
        ready=0,
        conditions=[
            {
                "type": "Progressing",
                "status": "False",
                "reason": "ProgressDeadlineExceeded",
                "message": "took too long",
            },
        ],
    )
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Degraded", what="Degraded")
    assert condition(cluster, ns, "chat", "Degraded")["message"] == "took too long"
    warning = wait_for(lambda: events(cluster, ns, "ProgressDeadlineExceeded"), what="a Warning")
    assert warning[0]["type"] == "Warning"


def test_spec_changes_patch_the_children(cluster, ns):
    create(cluster, ns, "chat", scheduling={"nodeSelector": {"pool": "cpu"}})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")

    patch_spec(
        cluster,
        ns,
        "chat",
        {"replicas": 3, "model": {"source": "hf://Qwen/Qwen2.5-0.5B-Instruct"}, "scheduling": None},
    )
    deployment = wait_for(
        lambda: (
            (d := get(cluster, DEPLOYMENT, ns, "chat")) and d["spec"].get("replicas") == 3 and d
        ),
        what="3 replicas",
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][:4] == [
        "--model",
        "/models/hf",
        "--served-model-name",
        "Qwen/Qwen2.5-0.5B-Instruct",
    ]
    assert pod["initContainers"][0]["name"] == "model-download"
    assert "nodeSelector" not in pod  # a removed field is removed, not merged
    wait_for(
        lambda: status(cluster, ns, "chat").get("observedGeneration") == 2,
        what="observedGeneration 2",
    )

    patch_spec(
        cluster, ns, "chat", {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 5}}
    )
    hpa = wait_for(lambda: get(cluster, HPA, ns, "chat"), what="the HPA")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 5)
    wait_for(
        lambda: replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")) == {HANDOVER},
        what="replicas handed over",
    )
    assert get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 3

    patch_spec(cluster, ns, "chat", {"autoscaling": {"enabled": False}, "replicas": 2})
    wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"].get("replicas") == 2, what="2 replicas"
    )
    assert get(cluster, PDB, ns, "chat") is not None  # always there


def test_kubectl_scale_resizes_the_deployment(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")

    cluster.patch(*ISVC, ns, "chat", {"spec": {"replicas": 4}}, subresource="scale")

    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 4, what="4 replicas"
    )


def test_invalid_spec_is_reported_and_the_operator_keeps_running(cluster, ns):
    create(cluster, ns, "broken", replicas=-1, runtime={"extraArgs": ["--por=1"]})

    failed = wait_for(
        lambda: (
            status(cluster, ns, "broken").get("phase") == "Failed" and status(cluster, ns, "broken")
        )
    )
    ready = next(c for c in failed["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.replicas: must be >= 0" in ready["message"]
    assert "--por (read as --port)" in ready["message"]
    event = wait_for(lambda: events(cluster, ns, "InvalidSpec"), what="an InvalidSpec event")[0]
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "broken"
    assert "spec.replicas" in event["message"]
    assert get(cluster, DEPLOYMENT, ns, "broken") is None

    create(cluster, ns, "healthy")
    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "healthy"),
        what="the operator to handle the next object",
    )

    patch_spec(cluster, ns, "broken", {"replicas": 1, "runtime": {"extraArgs": []}})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "broken"), what="the fixed object to be applied")
    wait_for(
        lambda: status(cluster, ns, "broken").get("phase") == "Pending", what="Failed to clear"
    )

    patch_spec(cluster, ns, "broken", {"model": {"source": "hf://no-org"}})  # broken again
    wait_for(lambda: status(cluster, ns, "broken").get("phase") == "Failed", what="Failed again")
    args = get(cluster, DEPLOYMENT, ns, "broken")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[1] == "smollm2-135m"  # the last valid version keeps running
    assert status(cluster, ns, "broken")["url"] == f"http://broken.{ns}.svc.cluster.local"
    assert len(events(cluster, ns, "InvalidSpec")) == 2  # one per transition, none per resync


# --- status from pods and the autoscaler --------------------------------------------------------


def test_a_crash_looping_pod_is_degraded_within_one_resync(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    report_rollout(cluster, ns, "chat", ready=0, conditions=[])

    run_pod(cluster, ns, "chat", CRASH_LOOP)

    degraded = wait_for(
        lambda: (d := condition(cluster, ns, "chat", "Degraded")).get("status") == "True" and d,
        timeout=RESYNC_S + WAIT_S,
        what="Degraded",
    )
    assert degraded["reason"] == "CrashLoopBackOff"
    assert "CrashLoopBackOff" in degraded["message"] and "chat-5d4f-x1" in degraded["message"]
    assert status(cluster, ns, "chat")["phase"] == "Degraded"
    event = wait_for(lambda: events(cluster, ns, "CrashLoopBackOff"), what="a Warning event")[0]
    assert event["type"] == "Warning"


def test_an_autoscaler_without_metrics_is_degraded(cluster, ns):
    create(cluster, ns, "chat", autoscaling={"enabled": True})
    wait_for(lambda: get(cluster, HPA, ns, "chat"), what="the HPA")
    hpa_status = {
        "currentReplicas": 1,
        "desiredReplicas": 1,
        "conditions": [
            {"type": "AbleToScale", "status": "True", "reason": "SucceededGetScale"},
            {
                "type": "ScalingActive",
                "status": "False",
                "reason": "FailedGetPodsMetric",
                "message": "unable to get metric sluice_queue_requests: no custom metrics API",
            },
        ],  # fmt: skip
    }
    cluster.patch(*HPA, ns, "chat", {"status": hpa_status}, subresource="status")

    degraded = wait_for(
        lambda: (d := condition(cluster, ns, "chat", "Degraded")).get("status") == "True" and d,
        what="Degraded",
    )
    assert degraded["reason"] == "AutoscalingInactive"
    assert "no custom metrics API" in degraded["message"]


# --- upgrades and optional APIs ----------------------------------------------------------------


def test_an_operator_upgrade_does_not_roll_pods_for_a_new_default_image(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: status(cluster, ns, "chat").get("image") == IMAGE, what="the recorded image")
    as_an_older_operator_left_it(cluster, ns)
    applies = deployment_applies(cluster, ns)

    wait_for(lambda: deployment_applies(cluster, ns) > applies, timeout=RESYNC_S + WAIT_S,
             what="a resync")  # fmt: skip
    assert runtime_container(cluster, ns)["image"] == OLD_IMAGE  # kept: no roll
    assert status(cluster, ns, "chat")["image"] == OLD_IMAGE

    patch_spec(cluster, ns, "chat", {"env": [{"name": "LOG_LEVEL", "value": "debug"}]})
    wait_for(lambda: runtime_container(cluster, ns)["image"] == IMAGE, what="the new default")
    wait_for(lambda: status(cluster, ns, "chat")["image"] == IMAGE, what="the new record")


def test_pods_that_change_anyway_move_to_the_new_default_image(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: status(cluster, ns, "chat").get("image") == IMAGE, what="the recorded image")
    older_args = runtime_container(cluster, ns)["args"][:10]  # rendered without the new flags
    as_an_older_operator_left_it(cluster, ns, args=older_args)

    wait_for(lambda: runtime_container(cluster, ns)["image"] == IMAGE, timeout=RESYNC_S + WAIT_S,
             what="one roll to the new template and the new default image")  # fmt: skip
    assert "--drain-timeout" in runtime_container(cluster, ns)["args"]


def test_podmonitor_is_created_when_the_api_appears(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert not any(PODMONITOR[1] in r["path"] for r in cluster.requests() if f"/{ns}/" in r["path"])

    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    try:
        monitor = wait_for(
            lambda: get(cluster, PODMONITOR, ns, "chat"),
            timeout=RESYNC_S + WAIT_S,
            what="the PodMonitor, without a spec change",
        )
        assert monitor["metadata"]["ownerReferences"][0]["name"] == "chat"
        assert monitor["spec"]["podMetricsEndpoints"] == [
            {"port": "http", "path": "/metrics", "interval": "15s"}
        ]
    finally:
        cluster.undeclare(PODMONITOR_RESOURCE)


# --- what the operator sends -------------------------------------------------------------------

# Permissions the operator holds without sending a request that needs them.
IMPLIED = {
    # an hf:// model's token Secret, read to pin its revision (test_operator_revision.py)
    ("", "secrets", "get"),
    # ownerReferences with blockOwnerDeletion, under OwnerReferencesPermissionEnforcement
    ("sluice.dev", "inferenceservices/finalizers", "update"),
    # held only so that RBAC lets the operator grant them in the router's Role
    ("discovery.k8s.io", "endpointslices", "get"),
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
}


def test_every_write_is_valid_and_the_rbac_table_is_exact(cluster, ns):
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    cluster.declare(INFERENCEPOOL_RESOURCE, INFERENCEPOOL_INFO)
    try:
        create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2},
               networkPolicy={"enabled": True}, router={"enabled": True},
               inferencePool={"enabled": True})  # fmt: skip
        for what in (HPA, PDB, PODMONITOR, NETWORKPOLICY, INFERENCEPOOL):
            wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=what[1])
        for what in (DEPLOYMENT, SERVICEACCOUNT, ROLE, ROLEBINDING, PODMONITOR, NETWORKPOLICY):
            wait_for(lambda w=what: get(cluster, w, ns, "chat-router"), what=f"router {what[1]}")
        report_replicas(cluster, ns, "chat-router", replicas=1, available=1)
        wait_for(lambda: condition(cluster, ns, "chat", "RouterReady")["status"] == "True",
                 what="the router ready")  # fmt: skip
        wait_for(
            lambda: HANDOVER in replicas_owners(get(cluster, DEPLOYMENT, ns, "chat")),
            what="the hand-over",
        )
        run_pod(cluster, ns, "chat", CRASH_LOOP)
        wait_for(lambda: events(cluster, ns, "CrashLoopBackOff"), what="a Warning")
        patch_spec(
            cluster,
            ns,
            "chat",
            {"autoscaling": {"enabled": False}, "networkPolicy": {"enabled": False},
             "router": {"enabled": False}, "inferencePool": {"enabled": False}},
        )  # fmt: skip
        wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat-router") is None, what="no router")
        wait_for(lambda: get(cluster, INFERENCEPOOL, ns, "chat") is None, what="no pool")
        wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
        wait_for(lambda: get(cluster, NETWORKPOLICY, ns, "chat") is None, what="the policy deleted")
        wait_for(lambda: get(cluster, ISVC, ns, "chat")["spec"]["replicas"] == 2, what="hand-back")
        wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 3, what="status")
    finally:
        cluster.undeclare(PODMONITOR_RESOURCE)
        cluster.undeclare(INFERENCEPOOL_RESOURCE)
    calls = [r for r in cluster.requests() if r["user_agent"].startswith(OPERATOR_AGENTS)]

    applied = [r for r in calls if "apply-patch" in r["content_type"]]
    assert {r["data"]["kind"] for r in applied} == {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodMonitor",
        "NetworkPolicy", "ServiceAccount", "Role", "RoleBinding", "InferencePool",
    }  # fmt: skip
    for request in applied:
        if request["params"]["fieldManager"] == HANDOVER:  # a partial object by design
            assert request["params"]["force"] == "false"
            assert request["data"].get("spec", {}).keys() <= {"replicas"}
            continue
        params = dict(request["params"])
        assert params.pop("dryRun", "All") == "All"  # a dry run checks whether pods would change
        assert params == {"fieldManager": "sluice-operator", "force": "true"}
        if request["data"]["kind"] not in ("PodMonitor", "InferencePool"):  # not built-in
            k8s_validate(request["data"])
    posted = [r for r in calls if r["method"] == "POST" and r["path"].endswith("/events")]
    assert posted
    for request in posted:
        k8s_validate(request["data"])
    crd_status = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    status_writes = [
        r for r in calls
        if r["method"] == "PATCH" and r["path"].endswith("/inferenceservices/chat/status")
    ]  # fmt: skip
    assert status_writes
    for request in status_writes:
        assert request["data"]["metadata"].keys() == {"resourceVersion"}  # a precondition
        written = {k: v for k, v in request["data"]["status"].items() if v is not None}
        jsonschema.Draft4Validator(crd_status["status"]).validate(written)  # null deletes

    enabled = frozenset({"always", "podmonitors", "inferencepools"})
    needed = {need for request in calls for need in rbac_needs(request)}
    for group, resource, verb in needed:
        assert rbac.allows(group, resource, verb, when=enabled), f"{verb} {group}/{resource}"
    granted = {
        (p.api_group, p.resource, verb)
        for p in rbac.REQUIRED_PERMISSIONS
        if p.when in enabled
        for verb in p.verbs
    }
    assert granted - needed == IMPLIED  # least privilege: nothing granted that is not used


def test_child_watches_are_filtered_by_label_on_the_server(cluster):
    selector = "app.kubernetes.io/managed-by=sluice-operator"
    for plural in ("pods", "deployments", "horizontalpodautoscalers", "services",
                   "serviceaccounts", "roles", "rolebindings"):  # fmt: skip
        watches = [
            r for r in cluster.requests()
            if r["params"].get("watch") == "true" and r["path"].endswith(f"/{plural}")
        ]  # fmt: skip
        assert watches and all(r["params"].get("labelSelector") == selector for r in watches)


def test_the_error_log_attributes_errors_to_namespaces():
    log = ErrorLog()
    record = logging.LogRecord("sluice.operator", logging.ERROR, "", 0, "[ml/chat] boom", (), None)
    log.emit(record)
    kopf_record = logging.LogRecord(
        "kopf.objects", logging.ERROR, "", 0, "Handler failed", (), None
    )
    kopf_record.k8s_ref = {"namespace": "team", "name": "x"}
    log.emit(kopf_record)
    assert [namespace for namespace, _ in log.records] == ["ml", "team"]
