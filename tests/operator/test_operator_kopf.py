"""The operator end to end: Kopf (KopfRunner) against the API emulator.

One operator runs for the whole module (resync every RESYNC_S seconds, quick back-off);
each test uses its own namespace, deleted at the end. The tests act as the user
(kubectl-like HTTP calls) and as the cluster's controllers (they write the status of
Deployments, ReplicaSets, pods and HPAs, and scale as the HPA does), and assert on what
the API server ends up holding. An error the operator logs (a handler or reconcile that
raised) fails the test during which it happened.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
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
REPLICASET = ("apps/v1", "replicasets")
POD = ("v1", "pods")
SERVICE = ("v1", "services")
HPA = ("autoscaling/v2", "horizontalpodautoscalers")
PDB = ("policy/v1", "poddisruptionbudgets")
PODMONITOR = ("monitoring.coreos.com/v1", "podmonitors")
NETWORKPOLICY = ("networking.k8s.io/v1", "networkpolicies")
OPERATOR_AGENTS = ("sluice-operator", "kopf/")
HANDOVER = "sluice-operator-replicas-handover"
HPA_MANAGER = "kube-controller-manager"
RESYNC_S = 2.0
WAIT_S = 20.0  # a deadline for conditions, generous for a loaded machine


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


class ErrorLog(logging.Handler):
    """Every ERROR the operator (Kopf or the reconcile) logs, with the namespace it names."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[tuple[str | None, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        ref = getattr(record, "k8s_ref", None) or {}
        text = self.format(record)
        found = re.search(r"\[([a-z0-9-]+)/", record.getMessage())
        namespace = ref.get("namespace") or (found.group(1) if found else None)
        self.records.append((namespace, text))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    emulated = Cluster()
    yield emulated
    emulated.close()


@pytest.fixture(scope="module")
def errors() -> Iterator[ErrorLog]:
    log = ErrorLog()
    log.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    logging.getLogger().addHandler(log)
    yield log
    logging.getLogger().removeHandler(log)
    assert not log.records, "the operator logged errors:\n" + "\n".join(t for _, t in log.records)


@pytest.fixture(scope="module", autouse=True)
def operator(
    cluster: Cluster, errors: ErrorLog, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KopfRunner]:
    kubeconfig = cluster.write_kubeconfig(tmp_path_factory.mktemp("kube") / "config")
    env = {
        "KUBECONFIG": str(kubeconfig),
        "SLUICE_DEFAULT_IMAGE": IMAGE,
        "SLUICE_RETRY_DELAY_SECONDS": "0.2",
        "SLUICE_RETRY_MAX_DELAY_SECONDS": "1",
        "SLUICE_RESYNC_SECONDS": str(RESYNC_S),
    }
    with (
        environment(**env),
        KopfRunner(["run", "--standalone", "-A", "--verbose", "-m", "sluice.operator"]) as runner,
    ):
        for plural in ("inferenceservices", "deployments", "pods", "horizontalpodautoscalers"):
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
def ns(request: pytest.FixtureRequest, cluster: Cluster, errors: ErrorLog) -> Iterator[str]:
    """The test's namespace; an operator error naming it (or nothing) fails the test."""
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.removeprefix("test_").lower())
    name = name[:60].strip("-")
    seen = len(errors.records)
    yield name
    for item in cluster.list(*ISVC, name):  # stop resyncing what the test left
        cluster.delete(*ISVC, name, item["metadata"]["name"])
    mine = [text for namespace, text in errors.records[seen:] if namespace in (name, None)]
    for record in [r for r in errors.records[seen:] if r[0] in (name, None)]:
        errors.records.remove(record)
    assert not mine, "the operator logged errors during this test:\n" + "\n".join(mine)


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


def events(cluster: Cluster, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.list("v1", "events", ns) if e["reason"] == reason]


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


def run_pod(cluster: Cluster, ns: str, name: str, pod_status: dict[str, Any]) -> None:
    """Act as the Deployment and ReplicaSet controllers and the kubelet: a ReplicaSet of the
    Deployment's current template and one pod of it with `pod_status`."""
    deployment = get(cluster, DEPLOYMENT, ns, name)
    assert deployment is not None
    template = copy.deepcopy(deployment["spec"]["template"])
    template["metadata"]["labels"]["pod-template-hash"] = "5d4f"
    owner = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
             "uid": deployment["metadata"]["uid"], "controller": True}  # fmt: skip
    rs_name = f"{name}-5d4f"
    cluster.create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": rs_name,
                "namespace": ns,
                "ownerReferences": [owner],
                "labels": template["metadata"]["labels"],
            },  # fmt: skip
            "spec": {
                "replicas": 1,
                "selector": deployment["spec"]["selector"],
                "template": template,
            },
        }
    )
    pod_owner = {**owner, "kind": "ReplicaSet", "name": rs_name,
                 "uid": get(cluster, REPLICASET, ns, rs_name)["metadata"]["uid"]}  # fmt: skip
    pod_name = f"{rs_name}-x1"
    cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": ns,
                "labels": template["metadata"]["labels"],
                "ownerReferences": [pod_owner],
            },  # fmt: skip
            "spec": template["spec"],
        }
    )
    cluster.patch(*POD, ns, pod_name, {"status": pod_status}, subresource="status")


def replicas_owners(deployment: dict[str, Any]) -> set[str]:
    return {
        entry["manager"]
        for entry in deployment["metadata"].get("managedFields", [])
        if "f:replicas" in entry.get("fieldsV1", {}).get("f:spec", {})
    }


def deployment_applies(cluster: Cluster, ns: str, name: str = "chat") -> int:
    return sum(
        1
        for r in cluster.requests()
        if r["method"] == "PATCH"
        and r["path"].endswith(f"/{ns}/deployments/{name}")
        and "apply-patch" in r["content_type"]
        and r["params"].get("fieldManager") == "sluice-operator"
    )


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
    }
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


# --- replicas: autoscaling on and off without losing a pod ---------------------------------------


def min_replicas_since(cluster: Cluster, ns: str, start: int) -> int:
    versions = cluster.history(*DEPLOYMENT, ns, "chat")[start:]
    return min(v["spec"].get("replicas", 1) for v in versions if v is not None)


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
    applies = deployment_applies(cluster, ns)
    wait_for(lambda: deployment_applies(cluster, ns) > applies, timeout=RESYNC_S + WAIT_S,
             what="another reconcile")  # fmt: skip
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


def test_a_new_autoscaled_service_starts_at_its_minimum(cluster, ns):
    create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2})
    deployment = wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    assert deployment["spec"]["replicas"] == 2


# --- status from pods and the autoscaler --------------------------------------------------------

CRASH_LOOP = {
    "phase": "Running",
    "containerStatuses": [
        {
            "name": "runtime",
            "ready": False,
            "restartCount": 4,
            "image": IMAGE,
            "imageID": "",
            "state": {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": "back-off 1m20s restarting failed container=runtime",
                }
            },
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}},
        }  # fmt: skip
    ],
}


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


OLD_IMAGE = "registry.example/sluice-runtime:0.9"


def runtime_container(cluster: Cluster, ns: str) -> dict[str, Any]:
    return get(cluster, DEPLOYMENT, ns, "chat")["spec"]["template"]["spec"]["containers"][0]


@contextlib.contextmanager
def reconciles_held(cluster: Cluster, ns: str, name: str = "chat") -> Iterator[None]:
    """No reconcile of `ns/name` runs inside: each fails at its first request (reading the
    object) and backs off. Entered once one has failed so (so none was still running: a
    key is reconciled by one worker at a time). The test must not read the object inside."""
    path = f"/namespaces/{ns}/inferenceservices/{name}"
    cluster.fail("GET", path, 503, times=10**6)

    def held() -> bool:
        return any(
            r["path"].endswith(path)
            and r["status"] == 503
            and r["user_agent"].startswith("sluice-operator")
            for r in cluster.requests()
        )

    try:
        wait_for(held, timeout=RESYNC_S + WAIT_S, what="a reconcile to be held")
        yield
    finally:
        cluster.clear_faults()


def as_an_older_operator_left_it(
    cluster: Cluster, ns: str, *, args: list[str] | None = None
) -> None:
    """The Deployment runs OLD_IMAGE (and `args`, if given) and the status records it."""
    patch = [
        {"op": "replace", "path": "/spec/template/spec/containers/0/image", "value": OLD_IMAGE}
    ]
    if args is not None:
        patch.append(
            {"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}
        )
    with reconciles_held(cluster, ns):
        cluster.patch(*DEPLOYMENT, ns, "chat", patch, json_patch=True)
        cluster.patch(*ISVC, ns, "chat", {"status": {"image": OLD_IMAGE}}, subresource="status")


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
    assert status(cluster, ns, "chat")["image"] == IMAGE


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
    # ownerReferences with blockOwnerDeletion, under OwnerReferencesPermissionEnforcement
    ("sluice.dev", "inferenceservices/finalizers", "update"),
    # deleting our PodMonitor happens only with SLUICE_POD_MONITORS=never
    ("monitoring.coreos.com", "podmonitors", "delete"),
}


def test_every_write_is_valid_and_the_rbac_table_is_exact(cluster, ns):
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    try:
        create(cluster, ns, "chat", autoscaling={"enabled": True, "minReplicas": 2},
               networkPolicy={"enabled": True})  # fmt: skip
        for what in (HPA, PDB, PODMONITOR, NETWORKPOLICY):
            wait_for(lambda w=what: get(cluster, w, ns, "chat"), what=what[1])
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
            {"autoscaling": {"enabled": False}, "networkPolicy": {"enabled": False}},
        )
        wait_for(lambda: get(cluster, HPA, ns, "chat") is None, what="the HPA deleted")
        wait_for(lambda: get(cluster, NETWORKPOLICY, ns, "chat") is None, what="the policy deleted")
        wait_for(lambda: get(cluster, ISVC, ns, "chat")["spec"]["replicas"] == 2, what="hand-back")
        wait_for(lambda: status(cluster, ns, "chat").get("observedGeneration") == 3, what="status")
    finally:
        cluster.undeclare(PODMONITOR_RESOURCE)
    calls = [r for r in cluster.requests() if r["user_agent"].startswith(OPERATOR_AGENTS)]

    applied = [r for r in calls if "apply-patch" in r["content_type"]]
    assert {r["data"]["kind"] for r in applied} == {
        "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "PodMonitor",
        "NetworkPolicy",
    }  # fmt: skip
    for request in applied:
        if request["params"]["fieldManager"] == HANDOVER:  # a partial object by design
            assert request["params"]["force"] == "false"
            assert request["data"].get("spec", {}).keys() <= {"replicas"}
            continue
        params = dict(request["params"])
        assert params.pop("dryRun", "All") == "All"  # a dry run checks whether pods would change
        assert params == {"fieldManager": "sluice-operator", "force": "true"}
        if request["data"]["kind"] != "PodMonitor":  # not a built-in kind
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


def test_child_watches_are_filtered_by_label_on_the_server(cluster):
    selector = "app.kubernetes.io/managed-by=sluice-operator"
    for plural in ("pods", "deployments", "horizontalpodautoscalers", "services"):
        watches = [
            r for r in cluster.requests()
            if r["params"].get("watch") == "true" and r["path"].endswith(f"/{plural}")
        ]  # fmt: skip
        assert watches and all(r["params"].get("labelSelector") == selector for r in watches)


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
