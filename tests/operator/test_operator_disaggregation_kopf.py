"""spec.disaggregation end to end (KopfRunner against the API emulator): the two pools
replace the runtime Deployment, the model Service sends to the router at once, Ready waits
for both pools and the router, switching it off brings the runtime Deployment back and
removes every P/D child, and a spec P/D cannot serve is reported, not applied."""

from __future__ import annotations

from kopf_testkit import (
    DEPLOYMENT,
    HPA,
    PDB,
    SERVICE,
    condition,
    create,
    events,
    get,
    patch_spec,
    report_replicas,
    status,
)
from operator_cluster import wait_for

RUNTIME_PODS = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
ROUTER_PODS = {"app.kubernetes.io/name": "sluice-router", "app.kubernetes.io/instance": "chat"}
POOLS = ("chat-prefill", "chat-decode")
POOL_OBJECTS = [(what, name) for name in POOLS for what in (DEPLOYMENT, SERVICE, PDB)]


def ready(cluster, ns: str) -> tuple[str, str]:
    cond = condition(cluster, ns, "chat", "Ready")
    return cond.get("status", ""), cond.get("reason", "")


def test_the_pools_replace_the_runtime_deployment_and_go_when_it_is_switched_off(cluster, ns):
    create(cluster, ns, "chat", disaggregation={
        "enabled": True, "decode": {"replicas": 2, "autoscaling": {"enabled": True}}})  # fmt: skip
    for what, name in [*POOL_OBJECTS, (HPA, "chat-decode"), (DEPLOYMENT, "chat-router")]:
        wait_for(lambda w=what, n=name: get(cluster, w, ns, n), what=f"{name} {what[1]}")
    assert get(cluster, DEPLOYMENT, ns, "chat") is None
    assert get(cluster, SERVICE, ns, "chat-workers") is None
    assert get(cluster, HPA, ns, "chat-prefill") is None  # its autoscaling is off
    # P/D pods serve only the router: the model Service selects it before it serves
    assert get(cluster, SERVICE, ns, "chat")["spec"]["selector"] == ROUTER_PODS
    router_args = get(cluster, DEPLOYMENT, ns, "chat-router")["spec"]["template"]["spec"][
        "containers"
    ][0]["args"]
    assert "--pd-disaggregation" in router_args
    assert "kubernetes.io/service-name=chat-prefill" in router_args

    report_replicas(cluster, ns, "chat-prefill", replicas=1, available=1)
    report_replicas(cluster, ns, "chat-decode", replicas=1, available=1)
    wait_for(lambda: ready(cluster, ns) == ("False", "RouterReplicasStarting"), what="no router")
    report_replicas(cluster, ns, "chat-router", replicas=1, available=1)
    wait_for(lambda: ready(cluster, ns) == ("True", "Serving"), what="Ready")
    assert not events(cluster, ns, "RouterReplicasStarting")  # a wait, not a Warning
    assert status(cluster, ns, "chat")["disaggregation"] == {
        "prefill": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1},
        "decode": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 2},
    }
    assert status(cluster, ns, "chat")["readyReplicas"] == 2

    patch_spec(cluster, ns, "chat", {"disaggregation": {"enabled": False}})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the runtime Deployment")
    for what, name in [*POOL_OBJECTS, (HPA, "chat-decode"), (DEPLOYMENT, "chat-router")]:
        wait_for(lambda w=what, n=name: get(cluster, w, ns, n) is None, what=f"{name} deleted")
    wait_for(lambda: status(cluster, ns, "chat").get("disaggregation") is None,
             what="status.disaggregation cleared")  # fmt: skip
    assert get(cluster, SERVICE, ns, "chat")["spec"]["selector"] == RUNTIME_PODS
    deleted = [e["message"] for e in events(cluster, ns, "Deleted")]
    assert f"Deleted Deployment {ns}/chat-prefill: no longer wanted." in deleted
    assert f"Deleted Service {ns}/chat-decode: no longer wanted." in deleted


def test_a_disaggregated_spec_with_the_router_off_is_reported_and_not_applied(cluster, ns):
    create(cluster, ns, "chat", disaggregation={"enabled": True}, router={"enabled": False})

    wait_for(lambda: ready(cluster, ns) == ("False", "InvalidSpec"), what="InvalidSpec")
    assert status(cluster, ns, "chat")["phase"] == "Failed"
    message = condition(cluster, ns, "chat", "Ready")["message"]
    assert "spec.router.enabled: must not be false with spec.disaggregation.enabled" in message
    event = wait_for(lambda: events(cluster, ns, "InvalidSpec"), what="an InvalidSpec event")[0]
    assert event["type"] == "Warning" and "spec.router.enabled" in event["message"]
    assert all(get(cluster, DEPLOYMENT, ns, name) is None for name in (*POOLS, "chat"))
