"""spec.router and spec.inferencePool, without a server: the router's objects, its command
line read by the router's own parser, its least-privilege RBAC, the InferencePool, and
the RouterReady condition. Every built-in object is validated with kubernetes-validate."""

from __future__ import annotations

import copy

import jsonschema
import pytest
from operator_testkit import IMAGE, SPEC_MATRIX, isvc_object
from operator_validators import k8s_validate

from sluice.operator import constants as c
from sluice.operator.builders import (
    build_inferencepool,
    build_pdb,
    build_router_deployment,
    build_router_pdb,
    build_router_role,
    build_router_role_binding,
    build_service,
    build_workers_service,
)
from sluice.operator.builders.args import serve_args
from sluice.operator.children import key_of, plan
from sluice.operator.parsing import SpecError, parse_spec
from sluice.operator.reconcile import read_spec
from sluice.operator.settings import Settings
from sluice.operator.status import Observed, RouterObserved, compute_status
from sluice.runtime.cli import build_parser
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.server_args import ServerArgs

ROUTER = {"enabled": True}
RUNTIME_PODS = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
ROUTER_PODS = {"app.kubernetes.io/name": "sluice-router", "app.kubernetes.io/instance": "chat"}
ROUTER_CHILDREN = [
    ("ServiceAccount", "chat-router"),
    ("Role", "chat-router"),
    ("RoleBinding", "chat-router"),
    ("Service", "chat-workers"),
    ("Deployment", "chat-router"),
    ("PodDisruptionBudget", "chat-router"),
]


def router_container(isvc) -> dict:
    [container] = build_router_deployment(isvc)["spec"]["template"]["spec"]["containers"]
    return container


def parsed_router_args(isvc) -> RouterArgs:
    """The rendered command line as `sluice router` itself reads it (the real parser,
    abbreviations off, then RouterArgs' own validation)."""
    container = router_container(isvc)
    assert container["command"] == ["sluice", "router"]
    ns = build_parser().parse_args([*container["command"][1:], *container["args"]])
    return RouterArgs.from_cli_args(ns)


# --- the plan ------------------------------------------------------------------------------------


def test_the_router_adds_its_identity_workers_service_and_deployment(make_spec):
    result = plan(make_spec(router=ROUTER), podmonitors=None)

    assert [key_of(obj) for obj in result.apply] == [
        ("Deployment", "chat"),
        ("Service", "chat"),
        ("PodDisruptionBudget", "chat"),
        *ROUTER_CHILDREN,
    ]
    assert [(r.kind, name) for r, name in result.remove] == [
        ("HorizontalPodAutoscaler", "chat"),
        ("NetworkPolicy", "chat"),
        ("NetworkPolicy", "chat-router"),
    ]


def test_turning_the_router_off_removes_every_router_object(make_spec):
    result = plan(make_spec(), podmonitors=True)

    removed = [(r.kind, name) for r, name in result.remove]
    assert all(key in removed for key in ROUTER_CHILDREN)
    assert ("PodMonitor", "chat-router") in removed
    assert not [key for key in map(key_of, result.apply) if key[1] != "chat"]


def test_the_router_gets_its_own_podmonitor_and_networkpolicy(make_spec):
    isvc = make_spec(router=ROUTER, networkPolicy={"enabled": True})
    result = plan(isvc, podmonitors=True)
    by_key = {key_of(obj): obj for obj in result.apply}

    monitor = by_key[("PodMonitor", "chat-router")]
    assert monitor["spec"]["selector"] == {"matchLabels": ROUTER_PODS}
    policy = by_key[("NetworkPolicy", "chat-router")]
    assert policy["spec"]["podSelector"] == {"matchLabels": ROUTER_PODS}
    # the runtime pods' policy still admits the router: it runs in their own namespace
    runtime_policy = by_key[("NetworkPolicy", "chat")]
    own = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}}}
    assert own in runtime_policy["spec"]["ingress"][0]["from"]


def test_the_model_service_selects_the_router_only_when_told(make_spec):
    isvc = make_spec(router=ROUTER)

    assert build_service(isvc)["spec"]["selector"] == RUNTIME_PODS
    assert build_service(isvc, to_router=True)["spec"]["selector"] == ROUTER_PODS
    routed = plan(isvc, podmonitors=None, to_router=True).apply
    assert next(o for o in routed if key_of(o) == ("Service", "chat"))["spec"]["selector"] == (
        ROUTER_PODS
    )
    # with the router off, to_router means nothing
    off = plan(make_spec(), podmonitors=None, to_router=True).apply
    assert next(o for o in off if key_of(o) == ("Service", "chat"))["spec"]["selector"] == (
        RUNTIME_PODS
    )


# --- the router's disruption budget ------------------------------------------------------------


def test_the_router_pods_have_their_own_disruption_budget(make_spec):
    isvc = make_spec(namespace="ml", router={"enabled": True, "replicas": 2})
    pdb = build_router_pdb(isvc)

    assert pdb == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": "chat-router",
            "namespace": "ml",
            "labels": build_router_deployment(isvc)["metadata"]["labels"],
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": ROUTER_PODS},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
    # it selects exactly the router Deployment's pods, and never the runtime's (whose own
    # budget selects only them)
    router = build_router_deployment(isvc)["spec"]
    assert pdb["spec"]["selector"] == router["selector"]
    assert ROUTER_PODS.items() <= router["template"]["metadata"]["labels"].items()
    assert build_pdb(isvc)["spec"]["selector"] == {"matchLabels": RUNTIME_PODS}
    k8s_validate(pdb)


def test_the_router_budget_comes_and_goes_with_the_router(make_spec):
    routed = plan(make_spec(router=ROUTER), podmonitors=None)
    assert [o for o in routed.apply if key_of(o) == ("PodDisruptionBudget", "chat-router")] == [
        build_router_pdb(make_spec(router=ROUTER))
    ]
    off = plan(make_spec(), podmonitors=None)
    assert ("PodDisruptionBudget", "chat-router") in [(r.kind, n) for r, n in off.remove]
    assert ("PodDisruptionBudget", "chat") in map(key_of, off.apply)  # the runtime's stays


# --- the router's image ---------------------------------------------------------------------------


def test_the_router_runs_the_operators_router_image_not_the_runtime_image(make_spec):
    isvc = make_spec(router=ROUTER)
    assert router_container(isvc)["image"] == c.DEFAULT_ROUTER_IMAGE == Settings().router_image
    assert isvc.image == IMAGE != c.DEFAULT_ROUTER_IMAGE  # the runtime pods keep theirs

    obj = isvc_object("chat", router=ROUTER)
    configured = parse_spec("chat", "default", obj["spec"], default_image=IMAGE,
                            router_image="registry.example/sluice-router:2.0")  # fmt: skip
    assert router_container(configured)["image"] == "registry.example/sluice-router:2.0"


def test_the_router_image_is_an_operator_setting():
    assert Settings.from_env({"SLUICE_ROUTER_IMAGE": "ghcr.io/x/router:1"}).router_image == (
        "ghcr.io/x/router:1"
    )
    flagged = Settings.from_env({"SLUICE_ROUTER_IMAGE": "ghcr.io/x/router:1"}).with_flags(
        ["--router-image", "ghcr.io/x/router:2"]
    )
    assert flagged.router_image == "ghcr.io/x/router:2"
    assert flagged.default_image == c.DEFAULT_IMAGE  # the runtime's is its own setting
    for bad in ("router image", " "):
        with pytest.raises(ValueError, match="router image"):
            Settings(router_image=bad)
    # each reconcile reads the spec with the configured router image
    body = isvc_object("chat", router=ROUTER) | {"metadata": {"name": "chat", "namespace": "ml"}}
    isvc = read_spec(body, Settings(router_image="ghcr.io/x/router:3"))
    assert router_container(isvc)["image"] == "ghcr.io/x/router:3"
    assert isvc.image == c.DEFAULT_IMAGE


def test_spec_router_image_overrides_the_operators(make_spec):
    isvc = make_spec(
        image="registry.example/runtime:1", imagePullSecrets=[{"name": "regcred"}],
        router={"enabled": True, "image": "registry.example/router@sha256:" + "0" * 64},
    )  # fmt: skip
    deployment = build_router_deployment(isvc)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.example/router@sha256:" + "0" * 64
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]  # pulled from the same registry
    k8s_validate(deployment)


@pytest.mark.parametrize("image", ["", "router image", "r" * 513, 7])
def test_an_invalid_router_image_is_refused_by_the_crd_and_the_operator(crd_validator, image):
    obj = isvc_object("chat", router={"enabled": True, "image": image})
    assert crd_validator.errors(copy.deepcopy(obj))
    with pytest.raises(SpecError, match=r"spec\.router\.image"):
        parse_spec("chat", "default", obj["spec"], default_image=IMAGE)


def test_the_crd_accepts_a_router_image(crd_validator):
    obj = isvc_object("chat", router={"enabled": True, "image": "ghcr.io/acme/sluice-router:1"})
    assert crd_validator.errors(obj) == []


# --- the router's command line, read by the router -----------------------------------------------


def test_the_router_command_is_what_sluice_router_parses(make_spec):
    isvc = make_spec(
        namespace="ml", router={"enabled": True, "policy": "least-load"},
        terminationGracePeriodSeconds=300,
    )  # fmt: skip
    args = parsed_router_args(isvc)

    assert args.policy == "least-load"
    assert args.host == "0.0.0.0"
    assert args.worker_urls == ()  # every worker comes from discovery
    assert args.discovery_enabled
    assert args.discover_selector == "kubernetes.io/service-name=chat-workers"
    assert args.discover_namespace == "ml"
    assert args.discover_port_name == "http"
    assert args.drain_timeout == isvc.drain_timeout_seconds
    assert 0 < args.drain_timeout < 300


@pytest.mark.parametrize("policy", ["cache-aware", "round-robin", "least-load", "random"])
def test_every_policy_the_crd_offers_is_one_the_router_accepts(make_spec, crd, policy):
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    offered = schema["properties"]["spec"]["properties"]["router"]["properties"]["policy"]["enum"]
    assert policy in offered
    assert parsed_router_args(make_spec(router={"enabled": True, "policy": policy})).policy == (
        policy
    )
    assert sorted(offered) == sorted(action_choices("--policy"))


def action_choices(flag: str) -> list[str]:
    router = build_parser()._subparsers._group_actions[0].choices["router"]  # type: ignore[union-attr]
    return list(next(a for a in router._actions if flag in a.option_strings).choices)


def test_the_router_listens_where_its_container_port_and_probes_point(make_spec):
    isvc = make_spec(router=ROUTER)
    container = router_container(isvc)
    args = parsed_router_args(isvc)

    assert container["ports"] == [{"name": "http", "containerPort": args.port, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/liveness", "port": "http"}
    service = build_service(isvc, to_router=True)
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_the_router_finds_the_runtime_pods_through_the_workers_service(make_spec):
    isvc = make_spec(router=ROUTER)
    workers = build_workers_service(isvc)
    args = parsed_router_args(isvc)

    # the EndpointSlice controller labels the slices kubernetes.io/service-name=<service>
    key, _, value = args.discover_selector.partition("=")
    assert (key, value) == ("kubernetes.io/service-name", workers["metadata"]["name"])
    assert workers["spec"]["selector"] == RUNTIME_PODS
    assert workers["spec"]["clusterIP"] == "None"
    # the slice's port is named after the Service port; the router looks for that name
    assert [p["name"] for p in workers["spec"]["ports"]] == [args.discover_port_name]
    runtime = plan(isvc, podmonitors=None).apply[0]["spec"]["template"]["spec"]["containers"][0]
    assert workers["spec"]["ports"][0]["targetPort"] in [p["name"] for p in runtime["ports"]]


def test_the_router_runs_without_a_gpu_as_non_root_with_its_resources(make_spec):
    isvc = make_spec(
        resources={"gpus": 1, "memory": "16Gi"},
        router={"enabled": True, "resources": {"cpu": "500m", "memory": "512Mi"}},
    )
    pod = build_router_deployment(isvc)["spec"]["template"]["spec"]
    [container] = pod["containers"]

    assert container["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"memory": "512Mi"},
    }
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["serviceAccountName"] == "chat-router"
    assert build_router_deployment(isvc)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


# --- least privilege ---------------------------------------------------------------------------------


def test_the_router_may_only_read_endpointslices_in_its_namespace(make_spec):
    isvc = make_spec(namespace="ml", router=ROUTER)
    role = build_router_role(isvc)
    binding = build_router_role_binding(isvc)

    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "ml"
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "chat-router",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "chat-router", "namespace": "ml"}
    ]


def test_the_router_watches_only_what_its_role_allows(make_spec):
    """What `sluice router` discovery asks the API for (a list and a watch of EndpointSlices
    in --discover-namespace) is inside the Role, in the Role's namespace."""
    isvc = make_spec(namespace="ml", router=ROUTER)
    args = parsed_router_args(isvc)
    role = build_router_role(isvc)
    assert args.discover_namespace == role["metadata"]["namespace"]
    [rule] = role["rules"]
    assert {"list", "watch"} <= set(rule["verbs"])


# --- every object is valid Kubernetes -------------------------------------------------------------


@pytest.mark.parametrize("spec", [s for _, s in SPEC_MATRIX], ids=[i for i, _ in SPEC_MATRIX])
def test_every_router_child_is_valid_kubernetes(make_spec, spec):
    isvc = make_spec(**spec, router={"enabled": True, "replicas": 2, "policy": "round-robin"},
                     networkPolicy={"enabled": True})  # fmt: skip
    children = plan(isvc, podmonitors=True, to_router=True).apply
    kinds = {obj["kind"] for obj in children}
    assert {"ServiceAccount", "Role", "RoleBinding", "Service", "Deployment"} <= kinds
    for obj in children:
        if obj["kind"] != "PodMonitor":  # not a built-in kind
            k8s_validate(obj)


# --- the Gateway API Inference Extension ---------------------------------------------------------

# InferencePool inference.networking.k8s.io/v1, its spec as the extension's v1 API
# reference documents it (InferencePoolSpec, EndpointPickerRef, Port): unknown fields
# are errors here, as a structural schema prunes them.
LABEL_VALUE = {"type": "string", "maxLength": 63,
               "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}  # fmt: skip
PORT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["number"],
    "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}},
}
INFERENCE_POOL_SPEC = {
    "type": "object",
    "additionalProperties": False,
    "required": ["selector", "targetPorts", "endpointPickerRef"],
    "properties": {
        "selector": {
            "type": "object",
            "additionalProperties": False,
            "required": ["matchLabels"],
            "properties": {"matchLabels": {"type": "object", "additionalProperties": LABEL_VALUE}},
        },
        "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "items": PORT},
        "endpointPickerRef": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name"],
            "properties": {
                "group": {"type": "string", "maxLength": 253},
                "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                "name": {"type": "string", "minLength": 1, "maxLength": 253},
                "port": PORT,
                "failureMode": {"enum": ["FailOpen", "FailClose"]},
            },
        },
    },
}


def test_the_inference_pool_selects_the_runtime_pods_on_their_port(make_spec):
    isvc = make_spec(inferencePool={"enabled": True})
    pool = build_inferencepool(isvc)

    jsonschema.Draft7Validator(INFERENCE_POOL_SPEC).validate(pool["spec"])
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"]["name"] == "chat"
    assert pool["spec"]["selector"] == {"matchLabels": RUNTIME_PODS}
    runtime = plan(isvc, podmonitors=None).apply[0]["spec"]["template"]["spec"]["containers"][0]
    assert pool["spec"]["targetPorts"] == [{"number": runtime["ports"][0]["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "chat-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


def test_the_endpoint_picker_can_be_named(make_spec):
    isvc = make_spec(inferencePool={"enabled": True, "endpointPickerRef": {
        "name": "shared-epp", "port": 9100, "failureMode": "FailOpen"}})  # fmt: skip
    ref = build_inferencepool(isvc)["spec"]["endpointPickerRef"]

    assert ref == {"kind": "Service", "name": "shared-epp", "port": {"number": 9100},
                   "failureMode": "FailOpen"}  # fmt: skip


def test_an_inference_pool_turns_on_the_vllm_metric_names(make_spec):
    """The runtime's own parser reads the rendered flags; the endpoint picker scrapes
    vllm:num_requests_waiting and friends, which `--metrics-compat vllm` adds."""
    isvc = make_spec(inferencePool={"enabled": True})
    ns = build_parser().parse_args(["serve", *serve_args(isvc, "smollm2-135m")])
    assert ServerArgs.from_cli_args(ns).metrics_compat == "vllm"

    plain = build_parser().parse_args(["serve", *serve_args(make_spec(), "smollm2-135m")])
    assert ServerArgs.from_cli_args(plain).metrics_compat != "vllm"


def test_the_pool_is_planned_only_where_its_api_is_served(make_spec):
    isvc = make_spec(inferencePool={"enabled": True})

    assert ("InferencePool", "chat") in map(key_of, plan(isvc, podmonitors=None,
                                                         inferencepools=True).apply)  # fmt: skip
    absent = plan(isvc, podmonitors=None, inferencepools=None)
    assert "InferencePool" not in {obj["kind"] for obj in absent.apply}
    assert "InferencePool" not in {r.kind for r, _ in absent.remove}  # nothing to delete
    off = plan(make_spec(), podmonitors=None, inferencepools=True)
    assert ("InferencePool", "chat") in [(r.kind, n) for r, n in off.remove]


# --- RouterReady ------------------------------------------------------------------------------------


def router_deployment(desired: int, available: int, generation: int = 1) -> dict:
    return {
        "metadata": {"generation": generation, "uid": "router-uid"},
        "spec": {"replicas": desired},
        "status": {"observedGeneration": generation, "replicas": desired,
                   "updatedReplicas": desired, "readyReplicas": available,
                   "availableReplicas": available},
    }  # fmt: skip


def status_with_router(router: RouterObserved) -> dict:
    runtime = {
        "metadata": {"generation": 1, "uid": "dep-uid"},
        "spec": {"replicas": 1},
        "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                   "readyReplicas": 1, "availableReplicas": 1},
    }  # fmt: skip
    observed = Observed(name="chat", namespace="ml", generation=2, deployment=runtime,
                        default_replicas=1, router=router)  # fmt: skip
    return compute_status(observed, previous={}, now="2026-01-01T00:00:00Z",
                          cluster_domain="cluster.local")  # fmt: skip


def router_condition(status: dict) -> dict:
    return next(c for c in status["conditions"] if c["type"] == "RouterReady")


def test_router_ready_once_every_replica_serves_and_the_service_sends_to_it():
    status = status_with_router(RouterObserved(router_deployment(2, 2), None, (), 2, True))

    assert router_condition(status)["status"] == "True"
    assert router_condition(status)["reason"] == "RouterServing"
    assert status["router"] == {"replicas": 2, "readyReplicas": 2, "routing": True}
    assert status["phase"] == "Ready"


def test_a_starting_router_leaves_the_service_on_the_runtime_pods_and_ready():
    status = status_with_router(RouterObserved(router_deployment(1, 0), None, (), 1, False))

    assert router_condition(status)["status"] == "False"
    assert router_condition(status)["reason"] == "RouterStarting"
    assert "the Service sends to the runtime pods" in router_condition(status)["message"]
    assert status["router"]["routing"] is False
    assert status["phase"] == "Ready"  # the model serves, directly


def test_a_crash_looping_router_pod_is_the_reason(crash_looping_router_pod):
    router = RouterObserved(router_deployment(1, 0), None, (crash_looping_router_pod,), 1, False)
    condition = router_condition(status_with_router(router))

    assert (condition["status"], condition["reason"]) == ("False", "CrashLoopBackOff")
    assert condition["message"].startswith("router pod chat-router-5d4f-x1:")


@pytest.fixture
def crash_looping_router_pod() -> dict:
    return {
        "metadata": {"name": "chat-router-5d4f-x1"},
        "status": {
            "phase": "Running",
            "containerStatuses": [{
                "name": "router", "ready": False, "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff",
                                      "message": "back-off 1m20s restarting failed container"}},
            }],
        },
    }  # fmt: skip


def test_without_the_router_there_is_no_router_condition():
    runtime = {"metadata": {"generation": 1}, "spec": {"replicas": 1}, "status": {}}
    observed = Observed(name="chat", namespace="ml", generation=1, deployment=runtime)
    status = compute_status(observed, previous={}, now="2026-01-01T00:00:00Z",
                            cluster_domain="cluster.local")  # fmt: skip
    assert "RouterReady" not in {c["type"] for c in status["conditions"]}
    assert status["router"] is None
