"""An optional kind the operator may not list or watch, while its settings say `auto`: the
chart's ClusterRole with `rbac.podMonitors: false` but an operator started without the
`SLUICE_POD_MONITORS=off` the chart's Deployment sets (a role edited by hand, an operator
run outside the chart). Kopf's watcher would get 403 on `list podmonitors` and stop the
whole operator; instead the operator asks the API server at start-up
(SelfSubjectAccessReview), never watches the kind, and reports it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kopf_testkit import DEPLOYMENT, SERVICE, condition, create, get
from operator_cluster import PODMONITOR_INFO, PODMONITOR_RESOURCE, Cluster, wait_for


@pytest.fixture(scope="module", autouse=True)
def podmonitors_served_but_not_listable(cluster: Cluster) -> Iterator[None]:
    """Set before the module's operator starts (autouse module fixtures come first)."""
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    cluster.deny("podmonitors", "list", "watch")
    yield
    cluster.allow("podmonitors")
    cluster.undeclare(PODMONITOR_RESOURCE)


def test_a_kind_it_may_not_watch_is_dropped_and_reported_not_fatal(cluster, ns):
    create(cluster, ns, "chat")

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    wait_for(lambda: get(cluster, SERVICE, ns, "chat"), what="the Service")
    optional = wait_for(
        lambda: condition(cluster, ns, "chat", "OptionalResourcesAvailable"),
        what="OptionalResourcesAvailable",
    )
    assert optional["status"] == "False" and optional["reason"] == "Forbidden"
    assert "PodMonitor: forbidden: may not list podmonitors.monitoring.coreos.com" in (
        optional["message"]
    )
    assert "InferencePool: API not served" in optional["message"]
    requests = cluster.requests()
    reviews = [r for r in requests if r["path"].endswith("/selfsubjectaccessreviews")]
    assert reviews, "the operator did not ask the API server what it may do"
    touched = [
        r for r in requests
        if "/podmonitors" in r["path"] and not r["user_agent"].startswith("kubectl")
    ]  # fmt: skip
    assert touched == []  # not watched, not read, not written: no 403 to die of
