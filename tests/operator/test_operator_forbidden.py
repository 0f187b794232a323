"""A 403 never stalls reconciling silently (end to end, as test_operator_kopf.py).

A denied optional kind (PodMonitor, InferencePool: the chart's `rbac.podMonitors: false` on
a cluster that serves them) is "not available": the service is reconciled without it and
the `OptionalResourcesAvailable` condition says so. A denied required write (RBAC, an
admission policy, a quota) is `Ready=False` with reason `Forbidden`, the server's message
and a Warning Event, retried with back-off."""

from __future__ import annotations

from kopf_testkit import (
    DEPLOYMENT,
    INFERENCEPOOL,
    PODMONITOR,
    RESYNC_S,
    SERVICE,
    WAIT_S,
    condition,
    create,
    events,
    get,
    status,
)
from operator_cluster import (
    INFERENCEPOOL_INFO,
    INFERENCEPOOL_RESOURCE,
    PODMONITOR_INFO,
    PODMONITOR_RESOURCE,
    wait_for,
)


def test_a_denied_podmonitor_kind_is_reported_and_the_rest_is_reconciled(cluster, ns):
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    cluster.deny("podmonitors", "create", "patch")  # an admission policy, say
    try:
        create(cluster, ns, "chat")

        wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
        wait_for(lambda: get(cluster, SERVICE, ns, "chat"), what="the Service")
        optional = wait_for(
            lambda: (
                condition(cluster, ns, "chat", "OptionalResourcesAvailable").get("status")
                == "False"
                and condition(cluster, ns, "chat", "OptionalResourcesAvailable")
            ),
            what="OptionalResourcesAvailable=False",
        )
        assert optional["reason"] == "Forbidden"
        assert "PodMonitor" in optional["message"] and "is forbidden" in optional["message"]
        assert status(cluster, ns, "chat")["phase"] == "Pending"  # not Failed: it serves
        assert get(cluster, PODMONITOR, ns, "chat") is None

        cluster.allow("podmonitors")  # the administrator grants it: the next resync uses it
        wait_for(
            lambda: get(cluster, PODMONITOR, ns, "chat"),
            timeout=RESYNC_S + WAIT_S,
            what="the PodMonitor once allowed",
        )
        wait_for(
            lambda: (
                condition(cluster, ns, "chat", "OptionalResourcesAvailable").get("status") == "True"
            ),
            timeout=RESYNC_S + WAIT_S,
            what="OptionalResourcesAvailable=True",
        )
    finally:
        cluster.allow("podmonitors")
        cluster.undeclare(PODMONITOR_RESOURCE)


def test_a_denied_inferencepool_kind_does_not_stop_the_service(cluster, ns):
    cluster.declare(INFERENCEPOOL_RESOURCE, INFERENCEPOOL_INFO)
    cluster.deny("inferencepools", "get", "create", "patch", "delete")  # RBAC in this namespace
    try:
        create(cluster, ns, "chat", inferencePool={"enabled": True})

        wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
        optional = wait_for(
            lambda: (
                condition(cluster, ns, "chat", "OptionalResourcesAvailable").get("reason")
                == "Forbidden"
                and condition(cluster, ns, "chat", "OptionalResourcesAvailable")
            ),
            what="OptionalResourcesAvailable=False",
        )
        assert "InferencePool" in optional["message"]
        assert get(cluster, INFERENCEPOOL, ns, "chat") is None
    finally:
        cluster.allow("inferencepools")
        cluster.undeclare(INFERENCEPOOL_RESOURCE)


def test_a_denied_required_write_is_forbidden_with_the_servers_message(cluster, ns):
    cluster.deny("deployments", "patch", "create")
    try:
        create(cluster, ns, "chat")

        ready = wait_for(
            lambda: (
                condition(cluster, ns, "chat", "Ready").get("reason") == "Forbidden"
                and condition(cluster, ns, "chat", "Ready")
            ),
            what="Ready=False Forbidden",
        )
        assert ready["status"] == "False"
        assert 'cannot patch resource "deployments"' in ready["message"]
        assert status(cluster, ns, "chat")["phase"] == "Failed"
        [event] = wait_for(lambda: events(cluster, ns, "Forbidden"), what="a Warning Event")
        assert event["type"] == "Warning" and "cannot patch" in event["message"]
        # retried (with back-off), and the Event is posted once, not per retry
        wait_for(lambda: len(denied_applies(cluster, ns)) >= 3, timeout=WAIT_S, what="retries")
        assert len(events(cluster, ns, "Forbidden")) == 1
    finally:
        cluster.allow("deployments")

    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), timeout=WAIT_S, what="the Deployment")
    wait_for(
        lambda: status(cluster, ns, "chat").get("phase") == "Pending", what="Forbidden cleared"
    )


def denied_applies(cluster, ns):
    return [
        r for r in cluster.requests()
        if r["method"] == "PATCH" and r["path"].endswith(f"/{ns}/deployments/chat")
        and r["status"] == 403
    ]  # fmt: skip


def test_forbidden_is_not_retried_as_transient():
    from sluice.operator.kube import ApiError

    error = ApiError(403, "Forbidden", "denied")
    assert error.forbidden and not error.transient  # reported, then retried with back-off
