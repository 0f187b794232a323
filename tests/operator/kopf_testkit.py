"""Helpers of the end-to-end operator tests: constants, acting as the cluster's
controllers, reading what the API server holds, holding reconciles by construction, and
the log handler that turns operator errors into test failures. The fixtures that start the
emulator and the operator are in conftest.py."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from operator_cluster import Cluster, wait_for
from operator_emulator import OPERATOR_AGENTS as OPERATOR_AGENTS  # re-exported for tests
from operator_testkit import IMAGE, isvc_object

ISVC = ("sluice.dev/v1alpha1", "inferenceservices")
DEPLOYMENT = ("apps/v1", "deployments")
REPLICASET = ("apps/v1", "replicasets")
POD = ("v1", "pods")
SERVICE = ("v1", "services")
HPA = ("autoscaling/v2", "horizontalpodautoscalers")
PDB = ("policy/v1", "poddisruptionbudgets")
PODMONITOR = ("monitoring.coreos.com/v1", "podmonitors")
NETWORKPOLICY = ("networking.k8s.io/v1", "networkpolicies")
SERVICEACCOUNT = ("v1", "serviceaccounts")
ROLE = ("rbac.authorization.k8s.io/v1", "roles")
ROLEBINDING = ("rbac.authorization.k8s.io/v1", "rolebindings")
INFERENCEPOOL = ("inference.networking.k8s.io/v1", "inferencepools")
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


def watching(cluster: Cluster, plural: str) -> bool:
    return any(
        r["params"].get("watch") == "true" and r["path"].endswith(f"/{plural}")
        for r in cluster.requests()
    )


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


def report_replicas(cluster: Cluster, ns: str, name: str, *, replicas: int, available: int) -> None:
    """Act as the Deployment controller with one ReplicaSet (the current template):
    `replicas` pods of which `available` serve."""
    deployment = get(cluster, DEPLOYMENT, ns, name)
    assert deployment is not None
    rs_name = f"{name}-5d4f"
    if get(cluster, REPLICASET, ns, rs_name) is None:
        run_pod(cluster, ns, name, {"phase": "Running"})
    cluster.patch(*REPLICASET, ns, rs_name, {"status": {"replicas": replicas,
                  "availableReplicas": available}}, subresource="status")  # fmt: skip
    cluster.patch(
        *DEPLOYMENT,
        ns,
        name,
        {
            "status": {
                "observedGeneration": deployment["metadata"]["generation"],
                "replicas": replicas,
                "updatedReplicas": replicas,
                "readyReplicas": available,
                "availableReplicas": available,
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
        and "dryRun" not in r["params"]
    )


def fresh_reads(cluster: Cluster, ns: str, name: str = "chat") -> int:
    """How often the operator read the InferenceService from the API server: once per
    fresh reconcile (the first, a retry, the resync); the others read its watch cache."""
    path = f"/namespaces/{ns}/inferenceservices/{name}"
    return sum(
        1
        for r in cluster.requests()
        if r["method"] == "GET"
        and r["path"].endswith(path)
        and r["user_agent"].startswith("sluice-operator")
    )


def wait_resynced(cluster: Cluster, ns: str, name: str = "chat") -> None:
    """Until a whole fresh reconcile (the resync) has run since the call: the second one
    to start has seen the first finish (a key is reconciled by one worker at a time)."""
    start = fresh_reads(cluster, ns, name)
    wait_for(
        lambda: fresh_reads(cluster, ns, name) >= start + 2,
        timeout=2 * RESYNC_S + WAIT_S,
        what="a resync",
    )


def min_replicas_since(cluster: Cluster, ns: str, start: int) -> int:
    versions = cluster.history(*DEPLOYMENT, ns, "chat")[start:]
    return min(v["spec"].get("replicas", 1) for v in versions if v is not None)


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


def rbac_needs(request: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(group, resource, verb) that a recorded request needs; discovery and access
    reviews (granted to every authenticated user by `system:basic-user`) need none."""
    parts = request["path"].strip("/").split("/")
    if parts[-1] == "selfsubjectaccessreviews":
        return []
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
