"""Healing against a real API server: deleted children come back, an edit of a field the
operator owns is reverted, and what other field managers add to the operator's lists (an
env var, a securityContext field) survives its server-side applies (list-map merge by key)."""

from __future__ import annotations

import json
from typing import Any

from cluster_kit import Kube, OperatorProcess, is_ready, wait_until

SPEC = {"model": {"source": "bundled://smollm2-135m"}, "resources": {"cpu": "1", "memory": "2Gi"}}


def create_ready(kube: Kube, ns: str, name: str, **spec: Any) -> dict[str, Any]:
    kube.apply(
        {
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns},
            "spec": {**SPEC, **spec},
        }
    )
    return wait_until(
        f"{ns}/{name} Ready",
        lambda: (obj := kube.isvc(ns, name)) and is_ready(obj) and obj,
        timeout=90,
        explain=lambda: str(kube.isvc(ns, name)),
    )


def deployment(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    return kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")


def container(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


def test_deleted_service_and_deployment_come_back(kube: Kube, operator: OperatorProcess, ns: str):
    create_ready(kube, ns, "chat")
    for kind, path in (
        ("service", f"/api/v1/namespaces/{ns}/services/chat"),
        ("deployment", f"/apis/apps/v1/namespaces/{ns}/deployments/chat"),
    ):
        old = kube.get(path)["metadata"]["uid"]
        kube.kubectl("delete", kind, "chat", "-n", ns, "--wait=true")
        wait_until(
            f"a new {kind}",
            lambda p=path, o=old: (obj := kube.get(p)) and obj["metadata"]["uid"] != o,
            timeout=60,
            explain=operator.tail,
        )
    wait_until("Ready again", lambda: is_ready(kube.isvc(ns, "chat")), timeout=90)


def test_an_edited_operator_field_is_reverted(kube: Kube, operator: OperatorProcess, ns: str):
    create_ready(kube, ns, "chat")
    before = deployment(kube, ns, "chat")
    image, generation = container(before)["image"], before["metadata"]["generation"]
    kube.kubectl("set", "image", "-n", ns, "deployment/chat", "runtime=evil:1")
    # the operator may revert before a read could see the edit: the generation counts both
    # writes (the edit, then the revert), so the edit is proven without racing the operator
    wait_until(
        "the image reverted",
        lambda: (now := deployment(kube, ns, "chat"))["metadata"]["generation"] >= generation + 2
        and container(now)["image"] == image,
        # the Deployment's watch event queues a reconcile at once: about a second here; the
        # deadline only bounds a loaded machine, it is not the resync (300 s) in disguise
        timeout=30,
        explain=operator.tail,
    )


def test_an_env_var_and_a_capability_added_by_another_manager_survive(
    kube: Kube, operator: OperatorProcess, ns: str
):
    """The operator applies whole desired objects with server-side apply; a real server
    merges `env` by name and keeps fields the operator never sends, when another manager
    set them (here `kubectl set env` and `kubectl patch`)."""
    create_ready(kube, ns, "chat")
    kube.kubectl("set", "env", "-n", ns, "deployment/chat", "EXTRA_FLAG=kept")
    # `privileged: true` is refused outright: the operator sets allowPrivilegeEscalation false
    refused = kube.kubectl(
        "patch", "-n", ns, "deployment/chat", "--type=strategic", "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"runtime",'
        '"securityContext":{"privileged":true}}]}}}}', check=False,
    )  # fmt: skip
    assert refused.returncode != 0
    assert "cannot set `allowPrivilegeEscalation` to false and `privileged` to true" in (
        refused.stderr
    )
    kube.kubectl(
        "patch", "-n", ns, "deployment/chat", "--type=strategic", "-p",
        '{"spec":{"template":{"spec":{"containers":[{"name":"runtime",'
        '"securityContext":{"capabilities":{"add":["NET_BIND_SERVICE"]}}}]}}}}',
    )  # fmt: skip
    # a spec change: the operator applies the Deployment again
    kube.kubectl(
        "patch", "sisvc", "chat", "-n", ns, "--type=merge",
        "-p", '{"spec":{"runtime":{"maxRunningRequests":7}}}',
    )  # fmt: skip
    generation = kube.isvc(ns, "chat")["metadata"]["generation"]
    wait_until(
        "the operator to apply generation 2",
        lambda: (kube.isvc(ns, "chat").get("status") or {}).get("observedGeneration") == generation,
        timeout=60,
        explain=operator.tail,
    )
    runtime = container(deployment(kube, ns, "chat"))
    args = " ".join(runtime.get("args", []) + runtime.get("command", []))
    assert "--max-running-requests 7" in args or "--max-running-requests=7" in args, args
    env = {e["name"]: e.get("value") for e in runtime.get("env", [])}
    assert env["EXTRA_FLAG"] == "kept"
    assert runtime["securityContext"]["capabilities"] == {
        "add": ["NET_BIND_SERVICE"],
        "drop": ["ALL"],
    }
    entries = deployment(kube, ns, "chat")["metadata"]["managedFields"]
    operations = {(m["manager"], m["operation"]) for m in entries}
    # the operator's fields are held by an Apply (a merge patch would be an Update), beside
    # the other managers' Updates
    assert {("sluice-operator", "Apply"), ("kubectl-set", "Update"),
            ("kubectl-patch", "Update")} <= operations  # fmt: skip
    assert not any(m["manager"] == "sluice-operator" and m["operation"] != "Apply"
                   for m in entries)  # fmt: skip
    # and the server enforces that ownership: another applier that does not force is
    # refused on the operator's field, with the operator named as its manager
    conflict = kube.kubectl(
        "apply", "--server-side", "--field-manager=someone-else", "-f", "-",
        input=json.dumps({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "chat", "namespace": ns},
            "spec": {"template": {"spec": {"containers": [{"name": "runtime",
                                                            "image": "evil:2"}]}}},
        }),
        check=False,
    )  # fmt: skip
    assert conflict.returncode != 0
    assert "conflict" in conflict.stderr.lower() and '"sluice-operator"' in conflict.stderr, (
        conflict.stderr
    )
