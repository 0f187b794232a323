"""spec.disaggregation, without a server: what a pool takes from the service, the two pool
Deployments (the service's pod plus the P/D flags, read back by the runtime's own parser),
their Services, budgets and autoscalers, the router's P/D command line (read by the
router's own parser), the children of the other shape removed, and the status of both
pools. Every built-in object is validated with kubernetes-validate."""

from __future__ import annotations

import copy

import pytest
from operator_testkit import IMAGE, isvc_object
from operator_validators import k8s_validate

from sluice.operator.builders import (
    build_deployment,
    build_hpa,
    build_networkpolicy,
    build_pdb,
    build_pool_service,
    build_router_deployment,
)
from sluice.operator.children import key_of, plan
from sluice.operator.conditions import RuntimePods
from sluice.operator.parsing import parse_spec
from sluice.operator.replicas import decide
from sluice.operator.status import Failure, Observed, RouterObserved, compute_status
from sluice.runtime.cli import build_parser
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.server_args import ServerArgs

PD = {"enabled": True}
MODE = "sluice.dev/disaggregation-mode"
RUNTIME_PODS = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
ROUTER_PODS = {"app.kubernetes.io/name": "sluice-router", "app.kubernetes.io/instance": "chat"}


def pools(isvc):
    prefill, decode = isvc.runtime_views
    return prefill, decode


def container(deployment: dict) -> dict:
    [runtime] = deployment["spec"]["template"]["spec"]["containers"]
    return runtime


def served(deployment: dict) -> ServerArgs:
    """The pod's command line as `sluice serve` reads it."""
    runtime = container(deployment)
    argv = [*runtime["command"], *runtime["args"]]
    assert argv[:2] == ["sluice", "serve"]
    return ServerArgs.from_cli_args(build_parser().parse_args(argv[1:]))


# --- the spec --------------------------------------------------------------------------------


def test_a_pool_takes_the_services_resources_and_autoscaling_field_by_field(make_spec):
    isvc = make_spec(
        resources={"gpus": 1, "memory": "32Gi", "cpu": "4"},
        autoscaling={"enabled": True, "minReplicas": 2, "maxReplicas": 6},
        disaggregation={**PD, "decode": {"replicas": 3, "resources": {"memory": "64Gi"},
                                         "autoscaling": {"maxReplicas": 16}}},
    )  # fmt: skip
    prefill, decode = isvc.disaggregation.prefill, isvc.disaggregation.decode

    assert (prefill.replicas, decode.replicas) == (1, 3)
    assert prefill.resources == isvc.resources
    assert (decode.resources.gpus, decode.resources.cpu, decode.resources.memory) == (
        1, "4", "64Gi",
    )  # fmt: skip
    assert (prefill.autoscaling.enabled, prefill.autoscaling.min_replicas) == (True, 2)
    assert (decode.autoscaling.min_replicas, decode.autoscaling.max_replicas) == (2, 16)
    assert decode.autoscaling.scale_down == isvc.autoscaling.scale_down


def test_each_pool_scales_on_its_own_metrics_unless_told(make_spec):
    isvc = make_spec(disaggregation=PD)
    assert [(m.type, m.target) for m in isvc.disaggregation.prefill.autoscaling.metrics] == [
        ("queuePromptTokens", 8192.0)
    ]
    assert [(m.type, m.target) for m in isvc.disaggregation.decode.autoscaling.metrics] == [
        ("runningRequests", 64.0)
    ]
    metrics = [{"type": "kvTokenUsage", "target": 0.7},
               {"type": "disaggWaitingRequests", "target": 4}]  # fmt: skip
    mine = make_spec(disaggregation={**PD, "decode": {"autoscaling": {"metrics": metrics}}})
    assert [m.metric_name for m in mine.disaggregation.decode.autoscaling.metrics] == [
        "sluice_kv_token_usage",
        "sluice_disagg_waiting_requests",
    ]


def test_disaggregation_turns_the_router_on(make_spec):
    assert make_spec(disaggregation=PD).router.enabled
    assert make_spec(disaggregation=PD, router={"policy": "round-robin"}).router.enabled
    assert not make_spec(disaggregation={"enabled": False}).router.enabled


@pytest.mark.parametrize(
    "spec",
    [
        {"disaggregation": PD},
        {"disaggregation": {**PD, "prefill": {"autoscaling": {"enabled": True}}}},
        {"disaggregation": {**PD, "decode": {"autoscaling": {"behavior": {"scaleDown": {}}}}},
         "autoscaling": {"enabled": True, "maxReplicas": 8}},
        {"disaggregation": {**PD, "decode": {"resources": {"memory": "8Gi"}}},
         "resources": {"gpus": 1}},
        {"disaggregation": {"enabled": False, "prefill": {"replicas": 2}}},
    ],
    ids=["on", "pool-autoscaling", "pool-behavior", "pool-resources", "off"],
)  # fmt: skip
def test_the_crds_defaults_are_the_operators(crd_validator, spec):
    """What the API server fills in changes nothing the operator reads (a pool's own
    resources and autoscaling have no defaults there: they fall back to the service's)."""
    obj = isvc_object(**{"model": {"source": "bundled://smollm2-135m"}, **spec})
    defaulted = crd_validator.default(obj)

    assert crd_validator.errors(obj) == []
    assert parse_spec("chat", "default", defaulted["spec"], default_image=IMAGE) == parse_spec(
        "chat", "default", obj["spec"], default_image=IMAGE
    )


# --- the pools' Deployments ------------------------------------------------------------------


def test_each_pool_runs_the_services_pod_with_its_mode(make_spec):
    isvc = make_spec(resources={"cpu": "2", "memory": "4Gi"}, disaggregation=PD)
    prefill, decode = (build_deployment(view) for view in pools(isvc))
    whole = build_deployment(make_spec(resources={"cpu": "2", "memory": "4Gi"}))

    assert (prefill["metadata"]["name"], decode["metadata"]["name"]) == (
        "chat-prefill",
        "chat-decode",
    )
    for deployment, role in ((prefill, "prefill"), (decode, "decode")):
        pods = {**RUNTIME_PODS, MODE: role}
        assert deployment["spec"]["selector"] == {"matchLabels": pods}
        assert pods.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
        [spread] = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
        assert spread["labelSelector"] == {"matchLabels": pods}
        assert served(deployment).disaggregation_mode == role
        k8s_validate(deployment)
    assert served(prefill).disaggregation_bootstrap_port == 8998
    assert "--disaggregation-bootstrap-port" not in container(decode)["args"]
    assert [p["name"] for p in container(prefill)["ports"]] == ["http", "bootstrap"]
    assert container(prefill)["ports"][1]["containerPort"] == 8998
    assert [p["name"] for p in container(decode)["ports"]] == ["http"]
    # everything else is the service's pod: the same model, flags, probes, volumes
    for deployment in (prefill, decode):
        runtime = container(deployment)
        args = runtime["args"]
        at = args.index("--disaggregation-mode")
        end = at + (4 if "--disaggregation-bootstrap-port" in args else 2)
        assert args[:at] + args[end:] == container(whole)["args"]
        same = {k: v for k, v in runtime.items() if k not in ("args", "ports")}
        assert same == {k: v for k, v in container(whole).items() if k not in ("args", "ports")}


def test_each_pool_has_its_own_replicas_and_resources(make_spec):
    isvc = make_spec(
        resources={"gpus": 1, "memory": "32Gi"},
        disaggregation={**PD, "prefill": {"replicas": 2},
                        "decode": {"replicas": 3, "resources": {"memory": "64Gi"}}},
    )  # fmt: skip
    prefill, decode = (build_deployment(view) for view in pools(isvc))

    assert (prefill["spec"]["replicas"], decode["spec"]["replicas"]) == (2, 3)
    assert container(prefill)["resources"]["limits"] == {"memory": "32Gi", "nvidia.com/gpu": "1"}
    assert container(decode)["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": "1"}
    assert served(decode).device == "cuda"


def test_lora_adapters_are_served_by_both_pools(make_spec):
    lora = {"adapters": [{"name": "sql", "source": "pvc://adapters/sql"}]}
    isvc = make_spec(model={"source": "bundled://smollm2-135m", "lora": lora}, disaggregation=PD)

    for view in pools(isvc):
        args = served(build_deployment(view))
        assert args.enable_lora and args.disaggregation_mode == view.role


def test_a_bootstrap_port_of_ones_own_reaches_the_flag_the_port_and_the_service(make_spec):
    prefill, _ = pools(make_spec(disaggregation={**PD, "bootstrapPort": 9100}))

    assert served(build_deployment(prefill)).disaggregation_bootstrap_port == 9100
    assert container(build_deployment(prefill))["ports"][1]["containerPort"] == 9100
    assert build_pool_service(prefill)["spec"]["ports"][1]["port"] == 9100


# --- the Services, the router, the budgets, the autoscalers ------------------------------------


def test_each_pool_has_a_headless_service_the_router_discovers_it_from(make_spec):
    prefill, decode = (build_pool_service(view) for view in pools(make_spec(disaggregation=PD)))

    assert prefill["metadata"]["name"] == "chat-prefill"
    assert prefill["spec"]["clusterIP"] == "None"
    assert prefill["spec"]["selector"] == {**RUNTIME_PODS, MODE: "prefill"}
    assert prefill["spec"]["ports"] == [
        {"name": "http", "port": 30000, "targetPort": "http", "protocol": "TCP",
         "appProtocol": "http"},
        {"name": "bootstrap", "port": 8998, "targetPort": "bootstrap", "protocol": "TCP"},
    ]  # fmt: skip
    assert decode["spec"]["selector"] == {**RUNTIME_PODS, MODE: "decode"}
    assert [p["name"] for p in decode["spec"]["ports"]] == ["http"]
    for service in (prefill, decode):
        k8s_validate(service)


def test_the_router_pairs_the_pools_found_through_their_services(make_spec):
    isvc = make_spec(namespace="ml", disaggregation=PD, router={"policy": "round-robin"})
    [router] = build_router_deployment(isvc)["spec"]["template"]["spec"]["containers"]
    argv = [*router["command"], *router["args"]]

    args = RouterArgs.from_cli_args(build_parser().parse_args(argv[1:]))
    args.validate()
    assert args.pd_disaggregation
    assert args.discover_prefill_selector == "kubernetes.io/service-name=chat-prefill"
    assert args.discover_decode_selector == "kubernetes.io/service-name=chat-decode"
    assert (args.discover_namespace, args.discover_port_name) == ("ml", "http")
    assert not args.discover_selector and args.policy == "round-robin"
    assert args.drain_timeout == isvc.drain_timeout_seconds


def test_each_pool_has_its_own_budget_and_autoscaler(make_spec):
    isvc = make_spec(disaggregation={**PD, "decode": {"autoscaling": {
        "enabled": True, "minReplicas": 2, "maxReplicas": 8}}})  # fmt: skip
    prefill, decode = pools(isvc)

    for view, role in ((prefill, "prefill"), (decode, "decode")):
        pdb = build_pdb(view)
        assert pdb["metadata"]["name"] == f"chat-{role}"
        assert pdb["spec"]["selector"] == {"matchLabels": {**RUNTIME_PODS, MODE: role}}
        k8s_validate(pdb)
    hpa = build_hpa(decode)
    assert hpa["metadata"]["name"] == "chat-decode"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-decode"}  # fmt: skip
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {
        "metric": {"name": "sluice_running_requests"},
        "target": {"type": "AverageValue", "averageValue": "64"}}}]  # fmt: skip
    [metric] = build_hpa(prefill)["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "sluice_queue_prompt_tokens"
    k8s_validate(hpa)


def test_the_network_policy_lets_decode_pods_fetch_the_kv(make_spec):
    policy = build_networkpolicy(make_spec(disaggregation=PD, networkPolicy={"enabled": True}))

    assert policy["spec"]["podSelector"] == {"matchLabels": RUNTIME_PODS}  # both pools
    assert policy["spec"]["ingress"][-1] == {
        "from": [{"podSelector": {"matchLabels": {**RUNTIME_PODS, MODE: "decode"}}}],
        "ports": [{"protocol": "TCP", "port": "bootstrap"}],
    }
    k8s_validate(policy)


# --- the plan: one shape or the other -----------------------------------------------------------


def test_the_plan_replaces_the_runtime_deployment_with_the_pools_and_the_router(make_spec):
    isvc = make_spec(
        disaggregation={**PD, "prefill": {"autoscaling": {"enabled": True}}},
        networkPolicy={"enabled": True},
    )
    result = plan(isvc, podmonitors=True, to_router=True)
    applied = [key_of(obj) for obj in result.apply]

    assert applied == [
        ("Deployment", "chat-prefill"), ("Deployment", "chat-decode"), ("Service", "chat"),
        ("Service", "chat-prefill"), ("Service", "chat-decode"),
        ("PodDisruptionBudget", "chat-prefill"), ("PodDisruptionBudget", "chat-decode"),
        ("HorizontalPodAutoscaler", "chat-prefill"), ("PodMonitor", "chat"),
        ("NetworkPolicy", "chat"), ("ServiceAccount", "chat-router"), ("Role", "chat-router"),
        ("RoleBinding", "chat-router"), ("Deployment", "chat-router"),
        ("PodDisruptionBudget", "chat-router"), ("PodMonitor", "chat-router"),
        ("NetworkPolicy", "chat-router"),
    ]  # fmt: skip
    assert [(r.kind, name) for r, name in result.remove] == [
        ("HorizontalPodAutoscaler", "chat-decode"),
        ("Service", "chat-workers"),
    ]
    # the one runtime Deployment's children, if switched from: looked up in the cache only
    assert [(r.kind, name) for r, name in result.retire] == [
        ("Deployment", "chat"), ("PodDisruptionBudget", "chat"),
        ("HorizontalPodAutoscaler", "chat"),
    ]  # fmt: skip
    by_key = {key_of(obj): obj for obj in result.apply}
    assert by_key[("Service", "chat")]["spec"]["selector"] == ROUTER_PODS
    assert by_key[("PodMonitor", "chat")]["spec"]["selector"] == {"matchLabels": RUNTIME_PODS}
    for obj in result.apply:
        if obj["kind"] != "PodMonitor":
            k8s_validate(obj)


def test_without_disaggregation_the_plan_removes_the_pools(make_spec):
    result = plan(make_spec(), podmonitors=None)

    retired = [(r.kind, name) for r, name in result.retire]
    assert retired == [
        (kind, f"chat-{role}") for role in ("prefill", "decode")
        for kind in ("Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler")
    ]  # fmt: skip
    assert not [name for _, name in result.remove if name.endswith(("-prefill", "-decode"))]
    assert ("Deployment", "chat") in map(key_of, result.apply)


def test_the_pools_replicas_are_decided_one_by_one(make_spec):
    isvc = make_spec(disaggregation={**PD, "decode": {"replicas": 2}})
    result = plan(isvc, podmonitors=None, replicas={"chat-prefill": None})
    replicas = {key_of(o)[1]: o["spec"].get("replicas") for o in result.apply
                if o["kind"] == "Deployment"}  # fmt: skip

    assert replicas == {"chat-prefill": None, "chat-decode": 2, "chat-router": 1}


def test_a_pool_whose_autoscaling_is_turned_off_goes_to_its_own_replicas(make_spec):
    """No scale subresource holds a pool's count: it is not copied into the spec."""
    _, decode = pools(make_spec(disaggregation={**PD, "decode": {"replicas": 2}}))
    deployment = {"metadata": {"managedFields": [
        {"manager": "kube-controller-manager", "fieldsV1": {"f:spec": {"f:replicas": {}}}}]},
        "spec": {"replicas": 5}}  # fmt: skip

    decision = decide(decode, deployment, hpa_exists=True)
    assert (decision.deployment_replicas, decision.copy_to_spec) == (2, None)


# --- the status of both pools ----------------------------------------------------------------

NOW = "2026-01-01T00:00:10Z"
TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "runtime"}]}}


def pool_pods(desired: int, available: int, *, uid: str, **conditions: str) -> RuntimePods:
    """A pool's Deployment as the controller reports it, and its current ReplicaSet."""
    deployment = {
        "metadata": {"generation": 1, "uid": uid},
        "spec": {"replicas": desired, "template": TEMPLATE},
        "status": {"observedGeneration": 1, "replicas": desired, "updatedReplicas": desired,
                   "readyReplicas": available, "availableReplicas": available,
                   "conditions": [{"type": t, "status": "False", "reason": r, "message": r}
                                  for t, r in conditions.items()]},
    }  # fmt: skip
    replica_set = {
        "metadata": {"labels": {"pod-template-hash": "h"},
                     "ownerReferences": [{"uid": uid, "controller": True}]},
        "spec": {"template": TEMPLATE},
        "status": {"availableReplicas": available},
    }  # fmt: skip
    return RuntimePods(deployment, replica_set, default_replicas=desired)


def router(available: int) -> RouterObserved:
    counts = {"replicas": 1, "updatedReplicas": 1, "readyReplicas": available,
              "availableReplicas": available}  # fmt: skip
    deployment = {"metadata": {"generation": 1}, "spec": {"replicas": 1},
                  "status": {"observedGeneration": 1, **counts}}  # fmt: skip
    return RouterObserved(deployment, None, (), replicas=1, routed=True)


def pd_status(prefill: RuntimePods, decode: RuntimePods, router_pods: RouterObserved) -> dict:
    observed = Observed(
        name="chat", namespace="ml", generation=3, deployment=None,
        router=router_pods, pools={"prefill": prefill, "decode": decode},
    )  # fmt: skip
    return compute_status(observed, previous={}, now=NOW, cluster_domain="cluster.local")


def conditions(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_ready_when_both_pools_and_the_router_serve():
    status = pd_status(pool_pods(1, 1, uid="p"), pool_pods(2, 2, uid="d"), router(1))

    assert conditions(status)["Ready"] == ("True", "Serving")
    assert status["phase"] == "Ready"
    assert status["disaggregation"] == {
        "prefill": {"replicas": 1, "readyReplicas": 1, "desiredReplicas": 1},
        "decode": {"replicas": 2, "readyReplicas": 2, "desiredReplicas": 2},
    }
    # the printer columns: both pools together
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (3, 3, 3)
    assert status["url"] == "http://chat.ml.svc.cluster.local"
    assert (
        status["selector"]
        == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime"
    )
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (
        ready["message"].startswith("prefill: 1/1 replicas") and "; decode: 2/2" in ready["message"]
    )


def test_not_ready_while_a_pool_or_the_router_does_not_serve():
    starting = pd_status(pool_pods(1, 1, uid="p"), pool_pods(2, 0, uid="d"), router(1))
    assert conditions(starting)["Ready"] == ("False", "ReplicasStarting")
    assert conditions(starting)["Progressing"] == ("True", "ReplicasStarting")
    assert conditions(starting)["Available"] == ("False", "NoReplicasAvailable")
    ready = next(c for c in starting["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("decode: 0/2 replicas")
    assert starting["disaggregation"]["decode"]["readyReplicas"] == 0

    no_router = pd_status(pool_pods(1, 1, uid="p"), pool_pods(2, 2, uid="d"), router(0))
    assert conditions(no_router)["Ready"] == ("False", "RouterReplicasStarting")
    ready = next(c for c in no_router["conditions"] if c["type"] == "Ready")
    assert ready["message"].startswith("router: 0/1 router replicas")
    assert conditions(no_router)["RouterReady"][0] == "False"


def test_a_pool_past_its_deadline_is_degraded_and_named():
    stuck = pool_pods(1, 0, uid="p", Progressing="ProgressDeadlineExceeded")
    status = pd_status(stuck, pool_pods(1, 1, uid="d"), router(1))

    assert conditions(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].startswith("prefill: ")


def test_a_failed_spec_keeps_the_pools_last_counts():
    previous = pd_status(pool_pods(1, 1, uid="p"), pool_pods(1, 1, uid="d"), router(1))
    failure = Failure("InvalidSpec", "spec.router.enabled: must not be false")
    observed = Observed(name="chat", namespace="ml", generation=4, deployment=None, failure=failure)
    status = compute_status(observed, previous=copy.deepcopy(previous), now=NOW,
                            cluster_domain="cluster.local")  # fmt: skip

    assert conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert status["disaggregation"] == previous["disaggregation"]
