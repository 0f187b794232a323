"""Every Kubernetes API permission the operator (and Kopf on its behalf) uses.

The Helm chart builds its least-privilege ClusterRole/Role from this table, and the
operator tests check that every request the operator sends to the API emulator is covered
by it. `scope` says where the rule must apply: "workload" for the namespaces that hold
InferenceServices (cluster-wide when the operator watches all namespaces), "cluster" for
cluster-scoped resources, "operator" for the operator's own namespace (its Lease). `when` names the operator setting that needs the rule:
"always", "leaderelection" (several replicas, see leader.py), "namespaces" (watching a list of
namespaces instead of the whole cluster), "podmonitors" (the Prometheus Operator's
CRDs are installed) or "inferencepools" (the Gateway API Inference Extension's CRDs are).

Discovery (`GET /api`, `/apis`, `/apis/<group>/<version>`) is allowed to every
authenticated user by the built-in `system:discovery` role, and a SelfSubjectAccessReview
(what the operator may do, asked at start-up) by `system:basic-user`: neither needs a rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Permission:
    api_group: str
    resource: str
    verbs: tuple[str, ...]
    scope: str  # "workload" | "cluster" | "operator"
    when: str  # "always" | "leaderelection" | "namespaces" | "podmonitors" | "inferencepools"
    why: str


REQUIRED_PERMISSIONS: tuple[Permission, ...] = (
    Permission(
        "sluice.dev",
        "inferenceservices",
        ("get", "list", "watch"),
        "workload",
        "always",
        "Kopf watches InferenceServices; each reconcile reads the one it converges",
    ),
    Permission(
        "sluice.dev",
        "inferenceservices/status",
        ("patch",),
        "workload",
        "always",
        "status (phase, conditions, replicas) is written through the status subresource",
    ),
    Permission(
        "sluice.dev",
        "inferenceservices/scale",
        ("patch",),
        "workload",
        "always",
        "turning autoscaling off keeps the autoscaler's count in spec.replicas",
    ),
    Permission(
        "sluice.dev",
        "inferenceservices/finalizers",
        ("update",),
        "workload",
        "always",
        "owner references with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)",
    ),
    Permission(
        "apps",
        "deployments",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the runtime and router Deployments: server-side apply, watched to heal and report;"
        " the router's deleted when spec.router is turned off",
    ),
    Permission(
        "apps",
        "replicasets",
        ("list", "watch"),
        "workload",
        "always",
        "the ReplicaSet of the Deployment's current template (readiness of the new version),"
        " watched into the operator's cache",
    ),
    Permission(
        "",
        "pods",
        ("list", "watch"),
        "workload",
        "always",
        "pod problems (CrashLoopBackOff, Unschedulable, ...) go into the Degraded condition",
    ),
    Permission(
        "",
        "services",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the model Service and the router's workers Service (deleted with the router)",
    ),
    Permission(
        "autoscaling",
        "horizontalpodautoscalers",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the HPA: applied while autoscaling is on, deleted when it is turned off, watched",
    ),
    Permission(
        "policy",
        "poddisruptionbudgets",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the PDBs: server-side apply, watched to heal; the runtime's always exists, the"
        " router's (<name>-router) is deleted when spec.router is turned off",
    ),
    Permission(
        "networking.k8s.io",
        "networkpolicies",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the optional NetworkPolicy: applied when enabled, deleted when disabled",
    ),
    Permission(
        "monitoring.coreos.com",
        "podmonitors",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "podmonitors",
        "the PodMonitor, when the Prometheus Operator is installed",
    ),
    Permission(
        "",
        "serviceaccounts",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the router's ServiceAccount (spec.router), deleted when the router is turned off",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "roles",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the router's Role (read EndpointSlices), deleted when the router is turned off",
    ),
    Permission(
        "rbac.authorization.k8s.io",
        "rolebindings",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "always",
        "the router's RoleBinding, deleted when the router is turned off",
    ),
    Permission(
        "discovery.k8s.io",
        "endpointslices",
        ("get", "list", "watch"),
        "workload",
        "always",
        "never used by the operator: RBAC lets it grant the router's Role only what it holds",
    ),
    Permission(
        "inference.networking.k8s.io",
        "inferencepools",
        ("get", "list", "watch", "create", "patch", "delete"),
        "workload",
        "inferencepools",
        "the InferencePool (spec.inferencePool), when the Gateway API Inference Extension is"
        " installed",
    ),
    Permission(
        "",
        "events",
        ("create",),
        "workload",
        "always",
        "Events on InferenceServices: children created or deleted, condition transitions",
    ),
    Permission(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        ("list", "watch"),
        "cluster",
        "always",
        "Kopf notices CRDs appearing or going (it degrades with a warning without this)",
    ),
    Permission(
        "",
        "namespaces",
        ("list", "watch"),
        "cluster",
        "namespaces",
        "Kopf resolves the watched namespaces (only when a namespace list is given)",
    ),
    Permission(
        "",
        "secrets",
        ("get",),
        "workload",
        "always",
        "the token Secret an hf:// model names (tokenSecretRef), to pin its revision",
    ),
    Permission(
        "coordination.k8s.io",
        "leases",
        ("get", "create", "update"),
        "operator",
        "leaderelection",
        "leader election: replicas campaign for, renew and release one Lease",
    ),
)


def allows(
    api_group: str, resource: str, verb: str, *, when: frozenset[str] = frozenset({"always"})
) -> bool:
    """Whether the table grants `verb` on `api_group/resource` for the given settings."""
    return any(
        p.api_group == api_group and p.resource == resource and verb in p.verbs and p.when in when
        for p in REQUIRED_PERMISSIONS
    )
