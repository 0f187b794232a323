"""The chart's RBAC is exactly the operator's permission table (operator/rbac.py) for the
chosen settings: every permission the table lists is granted where the operator needs it,
and nothing else is (no wildcards, no extra verbs, resources or namespaces).

tests/operator/test_operator_kopf.py records every request the operator sends to the API
emulator and checks that the table allows each of them and grants nothing unused; together
the two tests tie the chart's RBAC to the operator's real API calls.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import yaml
from chart_testkit import CHART_DIR, NAMESPACE, find, one, render_objects

from sluice.operator.rbac import REQUIRED_PERMISSIONS, Permission

WATCHED = ["team-a", "team-b"]
CLUSTER = None  # the "namespace" of a cluster-wide grant

SCENARIOS = [
    pytest.param(clusterwide, election, podmonitors, id=f"{scope}-{peer}-{pm}")
    for (clusterwide, scope), (election, peer), (podmonitors, pm) in itertools.product(
        [(True, "clusterwide"), (False, "namespaced")],
        [(False, "single"), (True, "elected")],
        [(True, "podmonitors"), (False, "no-podmonitors")],
    )
]


def values_for(clusterwide: bool, election: bool, podmonitors: bool) -> dict[str, Any]:
    return {
        "operator": {
            "watchNamespaces": [] if clusterwide else WATCHED,
            "leaderElection": {"enabled": election},
            "replicas": 2 if election else 1,
        },
        "rbac": {"podMonitors": podmonitors},
    }


def needed(p: Permission, clusterwide: bool, election: bool, podmonitors: bool) -> bool:
    """Whether the operator needs permission `p` with these settings (operator/rbac.py's
    `when`)."""
    return {
        "always": True,
        "namespaces": not clusterwide,
        "podmonitors": podmonitors,
        "inferencepools": True,  # rbac.inferencePools' default
        "leaderelection": election,
    }[p.when]


def expected_grants(clusterwide: bool, election: bool, podmonitors: bool) -> set[tuple]:
    """(namespace or CLUSTER, api group, resource, verb) the operator must hold."""
    grants = set()
    for p in REQUIRED_PERMISSIONS:
        if not needed(p, clusterwide, election, podmonitors):
            continue
        if p.scope == "operator":  # the Lease: the release namespace only
            where = [NAMESPACE]
        else:
            where = [CLUSTER] if clusterwide or p.scope == "cluster" else WATCHED
        grants |= {(ns, p.api_group, p.resource, verb) for ns in where for verb in p.verbs}
    return grants


def bound_rules(objects: list[dict[str, Any]]) -> list[tuple[str | None, dict[str, Any]]]:
    """(namespace or CLUSTER, rule) for every rule bound to the operator's ServiceAccount."""
    account = one(objects, "ServiceAccount")["metadata"]
    subject = {"kind": "ServiceAccount", "name": account["name"], "namespace": NAMESPACE}
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o
             for o in objects if o["kind"] in ("ClusterRole", "Role")}  # fmt: skip
    result = []
    for binding in find(objects, "ClusterRoleBinding") + find(objects, "RoleBinding"):
        assert binding["subjects"] == [subject]
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        where = binding["metadata"].get("namespace")  # None for a ClusterRoleBinding
        role = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        result += [(where, rule) for rule in role["rules"]]
    return result


def granted(objects: list[dict[str, Any]]) -> set[tuple]:
    grants = set()
    for where, rule in bound_rules(objects):
        for group, resource, verb in itertools.product(
            rule["apiGroups"], rule["resources"], rule["verbs"]
        ):
            grants.add((where, group, resource, verb))
    return grants


def allows(objects, namespace: str, group: str, resource: str, verb: str) -> bool:
    """Kubernetes' RBAC decision for the operator's ServiceAccount (wildcards included)."""

    def match(values, value):
        return "*" in values or value in values

    return any(
        (where is CLUSTER or where == namespace)
        and match(rule.get("apiGroups", []), group)
        and match(rule.get("resources", []), resource)
        and match(rule.get("verbs", []), verb)
        and not rule.get("resourceNames")
        for where, rule in bound_rules(objects)
    )


@pytest.mark.parametrize("clusterwide, election, podmonitors", SCENARIOS)
def test_rbac_grants_exactly_the_permission_table(clusterwide, election, podmonitors):
    objects = render_objects(values_for(clusterwide, election, podmonitors))
    assert granted(objects) == expected_grants(clusterwide, election, podmonitors)


@pytest.mark.parametrize("clusterwide, election, podmonitors", SCENARIOS)
def test_every_needed_permission_is_allowed_where_the_operator_works(
    clusterwide, election, podmonitors
):
    objects = render_objects(values_for(clusterwide, election, podmonitors))
    for p in REQUIRED_PERMISSIONS:
        if needed(p, clusterwide, election, podmonitors):
            where = [NAMESPACE] if p.scope == "operator" else WATCHED
            for ns, verb in itertools.product(where, p.verbs):
                assert allows(objects, ns, p.api_group, p.resource, verb), (ns, p, verb)


@pytest.mark.parametrize("clusterwide, election, podmonitors", SCENARIOS)
def test_rbac_has_no_wildcards_or_special_grants(clusterwide, election, podmonitors):
    objects = render_objects(values_for(clusterwide, election, podmonitors))
    for _, rule in bound_rules(objects):
        assert set(rule) == {"apiGroups", "resources", "verbs"}, rule  # no nonResourceURLs
        assert len(rule["apiGroups"]) == len(rule["resources"]) == 1, rule
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field] and not any("*" in v for v in rule[field]), rule
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])


def test_what_the_operator_never_does_is_denied():
    for values in (values_for(True, True, True), values_for(False, True, True)):
        objects = render_objects(values)
        for group, resource, verb in [
            ("", "secrets", "list"),  # get only: the token Secret a spec names
            ("", "pods", "delete"),  # pods are read for the status, never touched
            ("", "pods/exec", "create"),
            ("sluice.dev", "inferenceservices", "patch"),  # only status and scale are written
            ("", "configmaps", "create"),
            ("apps", "deployments", "update"),  # server-side apply patches
            ("sluice.dev", "inferenceservices", "delete"),
            ("sluice.dev", "inferenceservices", "create"),
            # the router's Role is created, but nothing beyond what the operator holds
            ("rbac.authorization.k8s.io", "roles", "bind"),
            ("rbac.authorization.k8s.io", "roles", "escalate"),
            ("rbac.authorization.k8s.io", "clusterroles", "create"),
            ("rbac.authorization.k8s.io", "clusterrolebindings", "create"),
            ("discovery.k8s.io", "endpointslices", "create"),  # only read, for the router's Role
            ("", "serviceaccounts/token", "create"),
            ("apiextensions.k8s.io", "customresourcedefinitions", "create"),
        ]:
            assert not allows(objects, "team-a", group, resource, verb), (group, resource, verb)


def test_the_inference_pool_rule_follows_its_switch():
    values = values_for(True, False, True)
    on = render_objects(values)
    off = render_objects({**values, "rbac": {**values["rbac"], "inferencePools": False}})
    pool = ("inference.networking.k8s.io", "inferencepools", "create")
    assert allows(on, "team-a", *pool)
    assert not allows(off, "team-a", *pool)
    assert allows(off, "team-a", "rbac.authorization.k8s.io", "roles", "create")  # the router's


def test_namespaced_operator_gets_nothing_outside_its_namespaces():
    objects = render_objects(values_for(False, False, True))
    assert not allows(objects, "kube-system", "apps", "deployments", "get")
    assert not allows(objects, "other", "sluice.dev", "inferenceservices", "watch")
    assert {o["metadata"]["namespace"] for o in find(objects, "Role")} == set(WATCHED)
    assert {o["metadata"]["namespace"] for o in find(objects, "RoleBinding")} == set(WATCHED)


def test_no_rbac_is_rendered_when_turned_off():
    objects = render_objects({"rbac": {"create": False}})
    assert not [o for o in objects if o["apiVersion"].startswith("rbac.authorization.k8s.io")]


def test_the_charts_permission_file_is_the_operators_table():
    """files/operator-rbac.yaml is generated from operator/rbac.py; on a difference run
    scripts/sync_chart_assets.sh."""
    data = yaml.safe_load((CHART_DIR / "files" / "operator-rbac.yaml").read_text())
    assert [
        Permission(p["apiGroup"], p["resource"], tuple(p["verbs"]), p["scope"], p["when"], p["why"])
        for p in data["permissions"]
    ] == list(REQUIRED_PERMISSIONS), "run scripts/sync_chart_assets.sh"


def aggregated(objects: list[dict[str, Any]], role: str) -> set[tuple[str, str, str]]:
    """(group, resource, verb) that Kubernetes' built-in `role` ClusterRole gains."""
    label = f"rbac.authorization.k8s.io/aggregate-to-{role}"
    return {
        (group, resource, verb)
        for o in find(objects, "ClusterRole")
        if o["metadata"].get("labels", {}).get(label) == "true"
        for rule in o["rules"]
        for group, resource, verb in itertools.product(
            rule["apiGroups"], rule["resources"], rule["verbs"]
        )
    }


def test_namespace_users_can_view_or_manage_inferenceservices():
    objects = render_objects({})
    read = {("sluice.dev", r, v) for r in ("inferenceservices", "inferenceservices/status",
            "inferenceservices/scale") for v in ("get", "list", "watch")}  # fmt: skip
    assert aggregated(objects, "view") == read
    write = {("sluice.dev", "inferenceservices", v)
             for v in ("create", "update", "patch", "delete", "deletecollection")}  # fmt: skip
    scale = {("sluice.dev", "inferenceservices/scale", v) for v in ("update", "patch")}
    assert aggregated(objects, "edit") == aggregated(objects, "admin") == read | write | scale
    for o in find(objects, "ClusterRole"):
        if o["metadata"]["name"].endswith(("-view", "-edit")):  # nothing else, nothing bound
            assert {g for r in o["rules"] for g in r["apiGroups"]} == {"sluice.dev"}
    assert not aggregated(render_objects({"rbac": {"aggregateToDefaultRoles": False}}), "view")
