"""`SLUICE_POD_MONITORS=off` / `SLUICE_INFERENCE_POOLS=off` (what the chart sets with
`rbac.podMonitors: false` / `rbac.inferencePools: false`): the operator has no access to
those kinds, so it never watches, reads, writes or deletes them, even where their APIs are
served, and says so in the OptionalResourcesAvailable condition."""

from __future__ import annotations

from kopf_testkit import DEPLOYMENT, condition, create, get, status
from operator_cluster import (
    INFERENCEPOOL_INFO,
    INFERENCEPOOL_RESOURCE,
    PODMONITOR_INFO,
    PODMONITOR_RESOURCE,
    wait_for,
)

OPERATOR_ENV = {"SLUICE_POD_MONITORS": "off", "SLUICE_INFERENCE_POOLS": "off"}


def test_kinds_turned_off_are_never_touched(cluster, ns):
    cluster.declare(PODMONITOR_RESOURCE, PODMONITOR_INFO)
    cluster.declare(INFERENCEPOOL_RESOURCE, INFERENCEPOOL_INFO)
    cluster.deny("podmonitors")
    cluster.deny("inferencepools")
    try:
        create(cluster, ns, "chat", inferencePool={"enabled": True})

        wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
        optional = wait_for(
            lambda: condition(cluster, ns, "chat", "OptionalResourcesAvailable"),
            what="OptionalResourcesAvailable",
        )
        assert optional["status"] == "True"
        assert optional["message"] == (
            "PodMonitor: turned off (no access); InferencePool: turned off (no access)"
        )
        assert status(cluster, ns, "chat")["phase"] == "Pending"
        touched = [
            r for r in cluster.requests()
            if ("/podmonitors" in r["path"] or "/inferencepools" in r["path"])
            and not r["user_agent"].startswith("kubectl")
        ]  # fmt: skip
        assert touched == []  # not even a watch
    finally:
        cluster.allow("podmonitors")
        cluster.allow("inferencepools")
        cluster.undeclare(PODMONITOR_RESOURCE)
        cluster.undeclare(INFERENCEPOOL_RESOURCE)
