"""`helm install` of the chart with Helm's own code into the empty cluster (the session's
`chart_release`), and the operator running as the chart's pod would: its command and
environment, under its ServiceAccount's token, so its RBAC is the chart's."""

from __future__ import annotations

import json
from typing import Any

from cluster_kit import OPERATOR_NS, OPERATOR_SA, RELEASE, Kube, OperatorProcess, wait_until


def test_helm_installs_the_chart_into_the_empty_cluster(kube: Kube, chart_release: dict[str, Any]):
    assert chart_release["name"] == RELEASE
    assert chart_release["status"] == "deployed"
    crd = kube.get(
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/inferenceservices.sluice.dev"
    )
    established = [c for c in crd["status"]["conditions"] if c["type"] == "Established"]
    assert established[0]["status"] == "True"
    for path in (
        f"/api/v1/namespaces/{OPERATOR_NS}/serviceaccounts/{OPERATOR_SA}",
        f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{RELEASE}-operator",
        f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{RELEASE}-operator",
    ):
        assert kube.get(path) is not None, path
    # the operator's Deployment rolls out (its pod runs on a fake node)
    kube.kubectl("rollout", "status", "-n", OPERATOR_NS, f"deployment/{RELEASE}-operator",
                 "--timeout=60s", timeout=90)  # fmt: skip


def test_the_operator_runs_under_the_charts_service_account(kube: Kube, operator: OperatorProcess):
    kubeconfig = operator.env["KUBECONFIG"]
    review = json.loads(kube.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig).stdout)
    assert review["status"]["userInfo"]["username"] == (
        f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
    )
    # least privilege: what the chart does not grant is refused by the real authorizer
    for verb, resource, namespace in (
        ("list", "secrets", "kube-system"),
        ("create", "clusterroles", ""),
        ("delete", "nodes", ""),
    ):
        args = ["auth", "can-i", verb, resource] + (["-n", namespace] if namespace else [])
        answer = kube.kubectl(*args, kubeconfig=kubeconfig, check=False).stdout.strip()
        assert answer == "no", (verb, resource)
    for args in (
        ("patch", "deployments.apps"),
        ("patch", "inferenceservices.sluice.dev", "--subresource=status"),
    ):
        answer = kube.kubectl("auth", "can-i", *args, "-n", "default", kubeconfig=kubeconfig,
                              check=False).stdout.strip()  # fmt: skip
        assert answer == "yes", args
    wait_until("the operator's liveness endpoint", lambda: operator._healthy(), timeout=30)
    assert operator.argv[1:] == ["-m", "sluice.operator"]  # the chart's command, as is
