"""spec.router and spec.inferencePool end to end (KopfRunner against the API emulator):
the router's objects appear owned, the model Service moves to the router only once a
router pod serves (and back when none does), RouterReady follows, turning the router off
removes everything it brought (its PodDisruptionBudget too), and an InferencePool appears
when its API does."""

from __future__ import annotations

from kopf_testkit import (
    CRASH_LOOP,
    DEPLOYMENT,
    INFERENCEPOOL,
    PDB,
    RESYNC_S,
    ROLE,
    ROLEBINDING,
    SERVICE,
    SERVICEACCOUNT,
    WAIT_S,
    condition,
    create,
    events,
    get,
    patch_spec,
    report_replicas,
    run_pod,
    status,
)
from operator_cluster import INFERENCEPOOL_INFO, INFERENCEPOOL_RESOURCE, wait_for
from operator_testkit import IMAGE

from sluice.operator.builders import build_router_deployment
from sluice.operator.parsing import parse_spec

RUNTIME_PODS = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
ROUTER_PODS = {"app.kubernetes.io/name": "sluice-router", "app.kubernetes.io/instance": "chat"}
ROUTER_OBJECTS = (
    (DEPLOYMENT, "chat-router"),
    (PDB, "chat-router"),
    (SERVICEACCOUNT, "chat-router"),
    (ROLE, "chat-router"),
    (ROLEBINDING, "chat-router"),
    (SERVICE, "chat-workers"),
)


def selector(cluster, ns: str) -> dict:
    return get(cluster, SERVICE, ns, "chat")["spec"]["selector"]


def router_ready(cluster, ns: str) -> tuple[str, str] | None:
    conds = {c["type"]: c for c in status(cluster, ns, "chat").get("conditions") or []}
    cond = conds.get("RouterReady")
    return None if cond is None else (cond["status"], cond["reason"])


def test_the_service_moves_to_the_router_once_it_serves_and_back_when_it_is_off(cluster, ns):
    owner = create(cluster, ns, "chat", router={"enabled": True, "policy": "round-robin"})
    uid = owner["metadata"]["uid"]
    for what, name in ROUTER_OBJECTS:
        child = wait_for(lambda w=what, n=name: get(cluster, w, ns, n), what=f"{name} {what[1]}")
        assert [(r["name"], r["uid"], r["controller"]) for r in child["metadata"]["ownerReferences"]] == [
            ("chat", uid, True)
        ]  # fmt: skip
    router = get(cluster, DEPLOYMENT, ns, "chat-router")
    expected = build_router_deployment(parse_spec("chat", ns, owner["spec"], default_image=IMAGE))
    assert router["spec"] == expected["spec"]

    # no router pod serves yet: the model Service keeps sending to the runtime pods
    wait_for(lambda: router_ready(cluster, ns) == ("False", "RouterStarting"), what="starting")
    assert selector(cluster, ns) == RUNTIME_PODS
    assert status(cluster, ns, "chat")["router"]["routing"] is False

    report_replicas(cluster, ns, "chat-router", replicas=1, available=1)
    wait_for(lambda: selector(cluster, ns) == ROUTER_PODS, what="the Service on the router")
    wait_for(lambda: router_ready(cluster, ns) == ("True", "RouterServing"), what="RouterReady")
    assert status(cluster, ns, "chat")["router"] == {
        "replicas": 1,
        "readyReplicas": 1,
        "routing": True,
    }

    patch_spec(cluster, ns, "chat", {"router": {"enabled": False}})
    for what, name in ROUTER_OBJECTS:
        wait_for(lambda w=what, n=name: get(cluster, w, ns, n) is None, what=f"{name} deleted")
    wait_for(lambda: selector(cluster, ns) == RUNTIME_PODS, what="the Service on the runtime")
    wait_for(lambda: router_ready(cluster, ns) is None, what="no RouterReady condition")
    assert status(cluster, ns, "chat").get("router") is None
    deleted = [e["message"] for e in events(cluster, ns, "Deleted")]
    assert f"Deleted Deployment {ns}/chat-router: no longer wanted." in deleted
    assert f"Deleted PodDisruptionBudget {ns}/chat-router: no longer wanted." in deleted
    assert get(cluster, PDB, ns, "chat") is not None  # the runtime's budget stays


def test_a_router_that_stops_serving_hands_the_service_back_to_the_runtime(cluster, ns):
    create(cluster, ns, "chat", router={"enabled": True})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat-router"), what="the router")
    report_replicas(cluster, ns, "chat-router", replicas=1, available=1)
    wait_for(lambda: selector(cluster, ns) == ROUTER_PODS, what="the Service on the router")

    report_replicas(cluster, ns, "chat-router", replicas=1, available=0)
    wait_for(lambda: selector(cluster, ns) == RUNTIME_PODS, what="the Service back on the runtime")
    wait_for(lambda: router_ready(cluster, ns) == ("False", "RouterStarting"),
             what="RouterReady=False while no router pod serves")  # fmt: skip


def test_a_crash_looping_router_pod_is_reported(cluster, ns):
    create(cluster, ns, "chat", router={"enabled": True})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat-router"), what="the router")
    crash = {**CRASH_LOOP, "containerStatuses": [
        {**CRASH_LOOP["containerStatuses"][0], "name": "router"}]}  # fmt: skip
    run_pod(cluster, ns, "chat-router", crash)

    wait_for(lambda: router_ready(cluster, ns) == ("False", "CrashLoopBackOff"),
             what="RouterReady=False CrashLoopBackOff")  # fmt: skip
    message = condition(cluster, ns, "chat", "RouterReady")["message"]
    assert message.startswith("router pod chat-router-5d4f-x1:")
    assert selector(cluster, ns) == RUNTIME_PODS


def test_a_router_object_someone_else_owns_blocks_with_a_name_conflict(cluster, ns):
    cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "chat-router", "namespace": ns}})  # fmt: skip
    create(cluster, ns, "chat", router={"enabled": True})

    wait_for(lambda: condition(cluster, ns, "chat", "Ready").get("reason") == "NameConflict",
             what="Ready=False NameConflict")  # fmt: skip
    assert "ServiceAccount" in condition(cluster, ns, "chat", "Ready")["message"]
    assert get(cluster, DEPLOYMENT, ns, "chat-router") is None


def test_the_inference_pool_is_created_when_its_api_appears(cluster, ns):
    create(cluster, ns, "chat", inferencePool={"enabled": True})
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    args = get(cluster, DEPLOYMENT, ns, "chat")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--metrics-compat") + 1] == "vllm"
    assert not any("inferencepools" in r["path"] for r in cluster.requests()
                   if f"/{ns}/" in r["path"])  # fmt: skip

    cluster.declare(INFERENCEPOOL_RESOURCE, INFERENCEPOOL_INFO)
    try:
        pool = wait_for(
            lambda: get(cluster, INFERENCEPOOL, ns, "chat"),
            timeout=RESYNC_S + WAIT_S,
            what="the InferencePool, without a spec change",
        )
        assert pool["metadata"]["ownerReferences"][0]["name"] == "chat"
        assert pool["spec"]["selector"] == {"matchLabels": RUNTIME_PODS}
        assert pool["spec"]["endpointPickerRef"]["name"] == "chat-epp"

        patch_spec(cluster, ns, "chat", {"inferencePool": {"enabled": False}})
        wait_for(lambda: get(cluster, INFERENCEPOOL, ns, "chat") is None, what="pool deleted")
    finally:
        cluster.undeclare(INFERENCEPOOL_RESOURCE)
