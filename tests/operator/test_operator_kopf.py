"""The operator end to end: Kopf (KopfRunner) against the kmock API emulator.

One operator runs for the whole module; each test uses its own namespace. The tests act
as the user (kubectl-like HTTP calls) and as the Deployment controller (they write
Deployment status), and assert on what the API server ends up holding.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from kopf.testing import KopfRunner
from operator_cluster import PODMONITOR_INFO, PODMONITOR_RESOURCE, Cluster, wait_for
from operator_testkit import IMAGE, isvc_object, load_crd
from operator_validators import k8s_validate

from sluice.operator import rbac
from sluice.operator.builders import build_deployment
from sluice.operator.parsing import parse_spec

ISVC = ("sluice.dev/v1alpha1", "inferenceservices")
DEPLOYMENT = ("apps/v1", "deployments")
SERVICE = ("v1", "services")
HPA = ("autoscaling/v2", "horizontalpodautoscalers")
PDB = ("policy/v1", "poddisruptionbudgets")
PODMONITOR = ("monitoring.coreos.com/v1", "podmonitors")
OPERATOR_AGENTS = ("sluice-operator", "kopf/")


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    emulated = Cluster()
    yield emulated
    emulated.close()


@pytest.fixture(scope="module", autouse=True)
def operator(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KopfRunner]:
    kubeconfig = cluster.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    env = {
        "KUBECONFIG": str(kubeconfig),
        "SLUICE_DEFAULT_IMAGE": IMAGE,
        "SLUICE_RETRY_DELAY_SECONDS": "0.5",
    }
    with (
        environment(**env),
        KopfRunner(["run", "--standalone", "-A", "--verbose", "-m", "sluice.operator"]) as runner,
    ):
        for plural in ("inferenceservices", "deployments"):
            wait_for(lambda p=plural: watching(cluster, p), what=f"the operator to watch {plural}")
        yield runner
    assert runner.exception is None
    assert runner.exit_code == 0


def watching(cluster: Cluster, plural: str) -> bool:
    return any(
        r["params"].get("watch") == "true" and r["path"].endswith(f"/{plural}")
        for r in cluster.requests()
    )


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> str:
    return request.node.name.removeprefix("test_").replace("_", "-")[:60].rstrip("-")


def get(cluster: Cluster, what: tuple[str, str], ns: str, name: str) -> dict[str, Any] | None:
    return cluster.get(*what, ns, name)


def status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    return (get(cluster, ISVC, ns, name) or {}).get("status") or {}


def condition(cluster: Cluster, ns: str, name: str, type_: str) -> dict[str, Any]:
    return next(
        (c for c in status(cluster, ns, name).get("conditions", []) if c["type"] == type_), {}
    )


def create(cluster: Cluster, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return cluster.create(isvc_object(name, ns, **spec))


def patch_spec(cluster: Cluster, ns: str, name: str, spec: dict[str, Any]) -> None:
    cluster.patch(*ISVC, ns, name, {"spec": spec})


def report_rollout(
    cluster: Cluster, ns: str, name: str, *, ready: int, conditions: list[dict[str, str]]
) -> None:
    """Act as the Deployment controller."""
    deployment = get(cluster, DEPLOYMENT, ns, name)
    assert deployment is not None
    replicas = deployment["spec"].get("replicas", 1)
    cluster.patch(
        *DEPLOYMENT,
        ns,
        name,
        {
            "status": {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "conditions": conditions,
            }
        },
        subresource="status",
    )


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
    assert {c["type"] for c in final["conditions"]} == {
        "Ready",
        "Available",
        "Progressing",
        "Degraded",
    }

    stored = get(cluster, ISVC, ns, "chat")
    assert (
        "sluice.dev/last-handled-configuration" in stored["metadata"]["annotations"]
    )  # progress: annotations
    assert "kopf" not in stored["status"]
    assert not stored["metadata"].get("finalizers")  # deleting never waits for the operator


def test_deployment_becoming_available_flips_ready(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert condition(cluster, ns, "chat", "Ready").get("status") != "True"

    report_rollout(
        cluster,
        ns,
        "chat",
        ready=0,
        conditions=[
            {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"},
        ],
    )
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
    assert condition(cluster, ns, "chat", "Available")["reason"] == "ReplicasReady"
    assert status(cluster, ns, "chat")["readyReplicas"] == 1

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


def test_spec_changes_patch_the_children(cluster, ns):
    create(cluster, ns, "chat", scheduling={"nodeSelector": {"pool": "cpu"}})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")

    patch_spec(
        cluster,
        ns,
        "chat",
        {
            "replicas": 3,
            "model": {"source": "hf://Qwen/Qwen2.5-0.5B-Instruct"},
            "scheduling": None,
        },
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
    wait_for(lambda: get(cluster, PDB, ns, "chat"), what="a PDB for 3 replicas")
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
        lambda: "replicas" not in get(cluster, DEPLOYMENT, ns, "chat")["spec"],
        what="replicas left to the HPA",
    )
    wait_for(lambda: get(cluster, PDB, ns, "chat") is None, what="the PDB gone (minReplicas 1)")

    patch_spec(cluster, ns, "chat", {"autoscaling": {"enabled": False}, "replicas": 2})
    wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"].get("replicas") == 2, what="2 replicas"
    )
    wait_for(lambda: get(cluster, PDB, ns, "chat"), what="the PDB back")


def test_kubectl_scale_resizes_the_deployment(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")

    cluster.patch(*ISVC, ns, "chat", {"spec": {"replicas": 4}}, subresource="scale")

    wait_for(
        lambda: get(cluster, DEPLOYMENT, ns, "chat")["spec"]["replicas"] == 4, what="4 replicas"
    )
    wait_for(lambda: get(cluster, PDB, ns, "chat"), what="a PDB for 4 replicas")


def test_invalid_spec_is_reported_and_the_operator_keeps_running(cluster, ns):
    create(cluster, ns, "broken", replicas=-1, runtime={"extraArgs": ["--port=1"]})

    failed = wait_for(
        lambda: (
            status(cluster, ns, "broken").get("phase") == "Failed" and status(cluster, ns, "broken")
        )
    )
    ready = next(c for c in failed["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "spec.replicas: must be >= 0" in ready["message"] and "--port" in ready["message"]
    event = wait_for(
        lambda: next(
            (e for e in cluster.list("v1", "events", ns) if e["reason"] == "InvalidSpec"), None
        ),
        what="an InvalidSpec event",
    )
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
    assert (
        get(cluster, DEPLOYMENT, ns, "broken")["spec"]["template"]["spec"]["containers"][0]["args"][
            1
        ]
        == "smollm2-135m"
    )  # the last valid version keeps running
    assert status(cluster, ns, "broken")["url"] == f"http://broken.{ns}.svc.cluster.local"


def applies(cluster: Cluster, ns: str, plural: str) -> int:
    return sum(
        1
        for r in cluster.requests()
        if r["method"] == "PATCH"
        and r["path"].endswith(f"/{ns}/{plural}/chat")
        and "apply-patch" in r["content_type"]
    )


def test_transient_api_errors_are_retried(cluster, ns):
    cluster.fail("PATCH", f"/{ns}/deployments/chat", 503, times=2)
    create(cluster, ns, "chat")

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment after retries")
    wait_for(lambda: status(cluster, ns, "chat").get("phase") == "Pending", what="status")
    assert applies(cluster, ns, "deployments") == 3


def test_a_rejected_child_fails_once_without_a_retry_loop(cluster, ns):
    cluster.fail("PATCH", f"/{ns}/deployments/chat", 422)
    create(cluster, ns, "chat")

    wait_for(
        lambda: condition(cluster, ns, "chat", "Ready").get("reason") == "ApplyFailed",
        what="ApplyFailed",
    )
    assert status(cluster, ns, "chat")["phase"] == "Failed"
    wait_for(
        lambda: any(e["reason"] == "ApplyFailed" for e in cluster.list("v1", "events", ns)),
        what="an event",
    )
    time.sleep(1.2)  # more than twice the retry delay
    assert applies(cluster, ns, "deployments") == 1


def test_a_foreign_object_with_the_same_name_is_not_taken_over(cluster, ns):
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
    assert get(cluster, DEPLOYMENT, ns, "chat") is None
    assert get(cluster, SERVICE, ns, "chat")["spec"] == {"ports": [{"port": 8080}]}
    wait_for(
        lambda: any(e["reason"] == "NameConflict" for e in cluster.list("v1", "events", ns)),
        what="an event",
    )


def test_deleting_the_service_leaves_nothing_behind(cluster, ns):
    create(cluster, ns, "chat", replicas=2, autoscaling={"enabled": True, "minReplicas": 2})
    for what in (DEPLOYMENT, SERVICE, HPA, PDB):
        wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=f"{what[1]}")
    wait_for(
        lambda: status(cluster, ns, "chat").get("observedGeneration") == 1,
        what="the handler to finish",
    )

    cluster.delete(*ISVC, ns, "chat")

    for what in (DEPLOYMENT, SERVICE, HPA, PDB):
        assert cluster.list(*what, ns) == [], f"{what[1]} left behind"
    deletes = [
        r
        for r in cluster.requests()
        if r["method"] == "DELETE" and f"/namespaces/{ns}/" in r["path"]
    ]
    assert [r["path"].rsplit("/", 2)[-2] for r in deletes] == [
        "inferenceservices"
    ]  # only ours: GC did the rest


def test_a_deleted_deployment_is_recreated(cluster, ns):
    create(cluster, ns, "chat")
    first = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")

    cluster.delete(*DEPLOYMENT, ns, "chat")

    again = wait_for(
        lambda: (
            (d := get(cluster, DEPLOYMENT, ns, "chat"))
            and d["metadata"]["uid"] != first["metadata"]["uid"]
            and d
        ),
        what="a new Deployment",
    )
    assert again["spec"] == first["spec"]


def test_podmonitor_is_created_only_when_the_api_exists(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert not any(PODMONITOR[1] in r["path"] for r in cluster.requests() if f"/{ns}/" in r["path"])

    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    try:
        patch_spec(cluster, ns, "chat", {"env": [{"name": "LOG_LEVEL", "value": "debug"}]})
        monitor = wait_for(lambda: get(cluster, PODMONITOR, ns, "chat"), what="the PodMonitor")
        assert monitor["metadata"]["ownerReferences"][0]["name"] == "chat"
        assert monitor["spec"]["podMetricsEndpoints"] == [
            {"port": "http", "path": "/metrics", "interval": "15s"}
        ]
    finally:
        cluster.undeclare(PODMONITOR_RESOURCE)


# Permissions the operator holds without sending a request that needs them.
IMPLIED = {
    # ownerReferences with blockOwnerDeletion, under OwnerReferencesPermissionEnforcement
    ("sluice.dev", "inferenceservices/finalizers", "update"),
    # deleting our PodMonitor happens only with SLUICE_POD_MONITORS=never
    ("monitoring.coreos.com", "podmonitors", "delete"),
}


def test_every_write_is_valid_and_the_rbac_table_is_exact(cluster, ns):
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    try:
        create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2})
        for what in (HPA, PDB, PODMONITOR):
            wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=what[1])
        patch_spec(cluster, ns, "chat", {"autoscaling": {"enabled": False}, "replicas": 1})
        wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
        wait_for(lambda: get(cluster, PDB, ns, "chat") is None, what="the PDB deleted")
        wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 2, what="status")
    finally:
        cluster.undeclare(PODMONITOR_RESOURCE)
    calls = [r for r in cluster.requests() if r["user_agent"].startswith(OPERATOR_AGENTS)]

    applied = [r for r in calls if "apply-patch" in r["content_type"]]
    assert {r["data"]["kind"] for r in applied} == {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodMonitor",
    }  # fmt: skip
    for request in applied:
        assert request["params"] == {"fieldManager": "sluice-operator", "force": "true"}
        if request["data"]["kind"] != "PodMonitor":  # not a built-in kind
            k8s_validate(request["data"])
    crd_status = load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    for request in calls:
        if request["method"] == "PATCH" and request["path"].endswith(
            "/inferenceservices/chat/status"
        ):
            written = {k: v for k, v in request["data"]["status"].items() if v is not None}
            jsonschema.Draft4Validator(crd_status["status"]).validate(written)  # null deletes

    enabled = frozenset({"always", "podmonitors"})
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


def rbac_needs(request: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(group, resource, verb) that a recorded request needs; discovery needs none."""
    parts = request["path"].strip("/").split("/")
    if parts[0] not in ("api", "apis") or len(parts) < (2 if parts[0] == "api" else 3):
        return []  # discovery and /version
    if parts[0] == "api":
        group, rest = "", parts[2:]
    else:
        group, rest = parts[1], parts[3:]
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    if not rest:
        return []
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    named = len(rest) >= 2
    method = request["method"]
    if method == "GET":
        verb = "watch" if request["params"].get("watch") == "true" else "get" if named else "list"
        return [(group, resource, verb)]
    if method == "POST":
        return [(group, resource, "create")]
    if method == "DELETE":
        return [(group, resource, "delete")]
    if method == "PATCH" and "apply-patch" in request["content_type"]:
        return [(group, resource, "patch"), (group, resource, "create")]  # apply may create
    return [(group, resource, {"PATCH": "patch", "PUT": "update"}[method])]
