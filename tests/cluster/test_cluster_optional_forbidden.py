"""A kind the operator may not watch, on the real API server: the chart's ClusterRole
without the PodMonitor rule (`rbac.podMonitors: false`), but an operator started without
the `SLUICE_POD_MONITORS=off` the chart's Deployment sets (a role edited by hand, an
operator run outside the chart), on a cluster that serves PodMonitors. Kopf's watcher
would get 403 on `list podmonitors` and stop the whole operator; it asks the server
(SelfSubjectAccessReview) at start-up instead, leaves the kind alone and says so."""

from __future__ import annotations

from typing import Any

from cluster_kit import (
    CHART_DIR,
    OPERATOR_NS,
    RELEASE,
    Kube,
    OperatorProcess,
    condition,
    is_ready,
    operator_process,
    wait_until,
)

CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podmonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com", "scope": "Namespaced",
        "names": {"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor",
                  "listKind": "PodMonitorList"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
            "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}}],
    },
}  # fmt: skip


def test_a_kind_the_role_does_not_grant_is_reported_not_fatal(
    kube: Kube, operator: OperatorProcess, ns: str, tmp_path
):
    import helm_python as helm

    config = helm.Config(kubeconfig_path=kube.plane.kubeconfig, namespace=OPERATOR_NS)
    chart = helm.Chart.load(CHART_DIR)
    crds = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    operator.stop()
    outside: OperatorProcess | None = None
    try:
        kube.apply(CRD)
        wait_until("the PodMonitor CRD Established",
                   lambda: (condition(kube.get(f"{crds}/{CRD['metadata']['name']}"), "Established")
                            or {}).get("status") == "True",
                   timeout=60)  # fmt: skip
        config.upgrade(chart, RELEASE, {"rbac": {"podMonitors": False}},
                       namespace=OPERATOR_NS, timeout=120)  # fmt: skip
        outside = operator_process(kube, tmp_path / "operator.log")
        assert outside.env.pop("SLUICE_POD_MONITORS") == "off"  # what the chart would set
        outside.start()
        kube.apply({"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService",
                    "metadata": {"name": "chat", "namespace": ns},
                    "spec": {"model": {"source": "bundled://smollm2-135m"},
                             "resources": {"cpu": "500m", "memory": "1Gi"}}})  # fmt: skip
        wait_until("Ready without PodMonitors", lambda: is_ready(kube.isvc(ns, "chat")),
                   timeout=120, explain=outside.tail)  # fmt: skip
        optional = condition(kube.isvc(ns, "chat"), "OptionalResourcesAvailable")
        assert optional["status"] == "False" and optional["reason"] == "Forbidden", optional
        assert "may not list podmonitors.monitoring.coreos.com cluster-wide" in optional["message"]
        assert outside.process is not None and outside.process.poll() is None, outside.tail()
        listed = kube.kubectl("get", "podmonitors.monitoring.coreos.com", "-n", ns, "-o", "name")
        assert listed.stdout.strip() == "", listed.stdout
    finally:
        if outside is not None:
            outside.stop()
        kube.request("DELETE", f"{crds}/{CRD['metadata']['name']}")
        config.upgrade(chart, RELEASE, {}, namespace=OPERATOR_NS, timeout=120)
        operator.start()
