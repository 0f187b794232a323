"""The emulator's server-side apply against what a real API server does: the documented
behaviour (https://kubernetes.io/docs/reference/using-api/server-side-apply/) and
structured-merge-diff's, which the API server runs. The same behaviours are checked
against a real kube-apiserver in tests/cluster/test_cluster_ssa_listmaps.py."""

from __future__ import annotations

import copy

import field_managers as fm
import pytest
from operator_testkit import load_crd

DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
CONTAINERS = ("spec", "template", "spec", "containers")


def config(**spec) -> dict:
    return {**DEPLOYMENT, "spec": spec}


def pods(*containers: dict, **spec) -> dict:
    """A Deployment configuration with these containers (and `spec`)."""
    return config(template={"spec": {"containers": list(containers)}}, **spec)


def containers(obj: dict) -> list[dict]:
    return obj["spec"]["template"]["spec"]["containers"]


def env(**values: str) -> list[dict]:
    return [{"name": k, "value": v} for k, v in values.items()]


def who_owns(ownership: fm.Ownership, *parts) -> set[str]:
    return {m.name for m in ownership.owners(fm.path(*parts))}


# -- fields ------------------------------------------------------------------------------


def test_a_field_released_by_its_only_manager_is_removed_and_defaulted():
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3, paused=False), owners, "op", force=True)
    obj = fm.apply(obj, config(paused=False), owners, "op", force=True)
    assert obj["spec"]["replicas"] == 1  # the Deployment default, not 3


def test_a_field_co_owned_by_another_manager_stays_when_one_releases_it():
    """The documented hand-over: a second manager applies the same value first."""
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3, paused=False), owners, "op", force=True)
    obj = fm.apply(obj, config(replicas=3), owners, "handover", force=False)  # shared, no conflict
    obj = fm.apply(obj, config(paused=False), owners, "op", force=True)
    assert obj["spec"]["replicas"] == 3
    # an update (the HPA through /scale) that changes the value takes it from everyone
    new = {**obj, "spec": {**obj["spec"], "replicas": 4}}
    fm.update(obj, new, owners, "kube-controller-manager", subresource="scale")
    assert fm.Manager("handover", "Apply") not in owners.fields  # owned nothing: gone
    assert owners.owners(fm.path("spec", "replicas")) == [
        fm.Manager("kube-controller-manager", "Update", "scale")
    ]


def test_changing_a_field_someone_else_owns_conflicts_unless_forced():
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3), owners, "op", force=True)
    fm.update(obj, {**obj, "spec": {"replicas": 5}}, owners, "kubectl")
    obj = {**obj, "spec": {"replicas": 5}}
    with pytest.raises(fm.ApplyConflict) as conflict:
        fm.apply(obj, config(replicas=3), owners, "op", force=False)
    assert str(conflict.value) == (
        'Apply failed with 1 conflict: conflict with "kubectl" using apps/v1: .spec.replicas'
    )  # the API server's message
    forced = fm.apply(obj, config(replicas=3), owners, "op", force=True)
    assert forced["spec"]["replicas"] == 3
    assert owners.owners(fm.path("spec", "replicas")) == [fm.Manager("op", "Apply")]


def test_fields_of_other_managers_survive_an_apply():
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3), owners, "op", force=True)
    annotated = {**obj, "metadata": {"name": "d", "annotations": {"note": "kept"}}}
    fm.update(obj, annotated, owners, "kubectl")
    again = fm.apply(annotated, config(replicas=3), owners, "op", force=True)
    assert again["metadata"]["annotations"] == {"note": "kept"}


def test_apply_version_kind_and_server_metadata_are_nobodys():
    owners = fm.Ownership()
    fm.apply(None, config(replicas=3), owners, "op", force=True)
    assert owners.fields == {fm.Manager("op", "Apply"): {fm.path("spec", "replicas")}}
    # an apply that sends nothing else owns nothing: the manager is gone
    fm.apply(None, DEPLOYMENT, fm.Ownership(), "empty", force=False)
    released = fm.Ownership()
    obj = fm.apply(None, config(replicas=3), released, "op", force=True)
    fm.apply(obj, DEPLOYMENT, released, "op", force=True)
    assert released.fields == {}


# -- list-maps (x-kubernetes-list-type: map) ---------------------------------------------


def test_two_appliers_share_the_containers_list_item_by_item():
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "image": "web:1"}), owners, "alpha", force=False)
    obj = fm.apply(obj, pods({"name": "side", "image": "side:1"}), owners, "beta", force=False)
    assert [(c["name"], c["image"]) for c in containers(obj)] == [
        ("main", "web:1"), ("side", "side:1")
    ]  # fmt: skip
    assert who_owns(owners, *CONTAINERS, {"name": "main"}) == {"alpha"}
    assert who_owns(owners, *CONTAINERS, {"name": "side"}, "image") == {"beta"}
    entry = {e["manager"]: e["fieldsV1"] for e in owners.managed_fields("apps/v1", "t")}
    assert entry["beta"] == {"f:spec": {"f:template": {"f:spec": {"f:containers": {
        'k:{"name":"side"}': {".": {}, "f:image": {}, "f:name": {}}}}}}}  # fmt: skip


def test_env_vars_are_owned_one_by_one_and_released_only_by_their_last_owner():
    owners = fm.Ownership()
    alpha = pods({"name": "main", "image": "web:1", "env": env(A="1", SHARED="x")})
    obj = fm.apply(None, alpha, owners, "alpha", force=False)
    beta = pods({"name": "main", "env": env(B="2", SHARED="x")})  # same value: shared
    obj = fm.apply(obj, beta, owners, "beta", force=False)
    # merged as the API server merges: beta's new B before the SHARED it shares
    assert [e["name"] for e in containers(obj)[0]["env"]] == ["A", "B", "SHARED"]
    assert owners_of(owners, "SHARED") == {"alpha", "beta"}

    # alpha stops sending its env vars: A goes (only alpha's), SHARED stays (beta's too)
    obj = fm.apply(obj, pods({"name": "main", "image": "web:1"}), owners, "alpha", force=False)
    assert containers(obj)[0]["env"] == env(B="2", SHARED="x")
    assert containers(obj)[0]["image"] == "web:1"
    # beta stops sending SHARED: now nobody owns it, it goes
    obj = fm.apply(obj, pods({"name": "main", "env": env(B="2")}), owners, "beta", force=False)
    assert containers(obj)[0]["env"] == env(B="2")


def owners_of(ownership: fm.Ownership, var: str) -> set[str]:
    return who_owns(ownership, *CONTAINERS, {"name": "main"}, "env", {"name": var})


def test_a_conflict_is_on_the_field_of_the_item_not_on_the_list():
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "image": "web:1"}), owners, "alpha", force=False)
    with pytest.raises(fm.ApplyConflict) as conflict:
        fm.apply(obj, pods({"name": "main", "image": "web:2"}), owners, "beta", force=False)
    assert str(conflict.value) == (
        'Apply failed with 1 conflict: conflict with "alpha":'
        ' .spec.template.spec.containers[name="main"].image'
    )
    forced = fm.apply(obj, pods({"name": "main", "image": "web:2"}), owners, "beta", force=True)
    assert containers(forced) == [{"name": "main", "image": "web:2"}]
    assert who_owns(owners, *CONTAINERS, {"name": "main"}, "image") == {"beta"}
    assert who_owns(owners, *CONTAINERS, {"name": "main"}) == {"alpha", "beta"}  # the item


def test_an_item_whose_field_another_manager_updated_goes_with_its_applier():
    """Owning a field of an item is not owning the item: the item goes when its last
    applier releases it (structured-merge-diff's prune), the other manager's field too."""
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "image": "web:1"}, {"name": "side", "image": "s:1"}),
                   owners, "alpha", force=False)  # fmt: skip
    edited = copy.deepcopy(obj)
    containers(edited)[1]["image"] = "s:2"
    fm.update(obj, edited, owners, "kubectl")  # kubectl edit: owns side's image only
    obj = fm.apply(edited, pods({"name": "main", "image": "web:1"}), owners, "alpha", force=False)
    assert [c["name"] for c in containers(obj)] == ["main"]
    assert fm.Manager("kubectl", "Update") not in owners.fields


def test_an_item_added_by_an_update_survives_the_appliers_apply():
    """What the operator relies on to tolerate an injected sidecar (drift.py)."""
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "image": "web:1"}), owners, "op", force=True)
    injected = copy.deepcopy(obj)
    containers(injected).append({"name": "proxy", "image": "mesh:1"})
    fm.update(obj, injected, owners, "mesh-injector")
    again = fm.apply(injected, pods({"name": "main", "image": "web:2"}), owners, "op", force=True)
    assert [(c["name"], c["image"]) for c in containers(again)] == [
        ("main", "web:2"), ("proxy", "mesh:1")
    ]  # fmt: skip
    assert who_owns(owners, *CONTAINERS, {"name": "proxy"}) == {"mesh-injector"}


def test_a_port_is_keyed_by_container_port_and_the_defaulted_protocol():
    owners = fm.Ownership()
    web = {"name": "main", "image": "web:1", "ports": [{"name": "http", "containerPort": 8080}]}
    obj = fm.apply(None, pods(web), owners, "alpha", force=False)
    port = fm.path(*CONTAINERS, {"name": "main"}, "ports",
                   {"containerPort": 8080, "protocol": "TCP"})  # fmt: skip
    assert owners.owners(port) == [fm.Manager("alpha", "Apply")]
    # the same port over UDP is another item: no conflict, two ports
    udp = {"name": "main", "ports": [{"name": "quic", "containerPort": 8080, "protocol": "UDP"}]}
    obj = fm.apply(obj, pods(udp), owners, "beta", force=False)
    assert [p["name"] for p in containers(obj)[0]["ports"]] == ["http", "quic"]


def test_volumes_and_mounts_are_keyed_by_name_and_mount_path():
    owners = fm.Ownership()
    mounted = {"name": "main", "image": "web:1",
               "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}  # fmt: skip
    cfg = pods(mounted)
    cfg["spec"]["template"]["spec"]["volumes"] = [{"name": "cache", "emptyDir": {}}]
    fm.apply(None, cfg, owners, "op", force=True)
    spec = ("spec", "template", "spec")
    assert owners.owners(fm.path(*spec, "volumes", {"name": "cache"}, "emptyDir"))
    assert owners.owners(fm.path(*CONTAINERS, {"name": "main"}, "volumeMounts",
                                 {"mountPath": "/cache"}, "name"))  # fmt: skip


# -- atomic lists and maps, sets ---------------------------------------------------------


def test_an_atomic_list_is_one_field():
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "args": ["--a"]}), owners, "alpha", force=False)
    assert owners.owners(fm.path(*CONTAINERS, {"name": "main"}, "args"))
    with pytest.raises(fm.ApplyConflict, match=r'\[name="main"\]\.args$'):
        fm.apply(obj, pods({"name": "main", "args": ["--b"]}), owners, "beta", force=False)


def test_an_atomic_map_is_one_field():
    owners = fm.Ownership()
    fm.apply(None, config(selector={"matchLabels": {"app": "d"}}), owners, "op", force=True)
    assert owners.fields[fm.Manager("op", "Apply")] == {fm.path("spec", "selector")}


def test_a_set_is_owned_value_by_value():
    owners = fm.Ownership()
    obj = fm.apply(None, {**DEPLOYMENT, "metadata": {"name": "d", "finalizers": ["a/x"]}},
                   owners, "alpha", force=False)  # fmt: skip
    obj = fm.apply(obj, {**DEPLOYMENT, "metadata": {"name": "d", "finalizers": ["b/y"]}},
                   owners, "beta", force=False)  # fmt: skip
    assert obj["metadata"]["finalizers"] == ["a/x", "b/y"]
    entries = {e["manager"]: e["fieldsV1"] for e in owners.managed_fields("apps/v1", "t")}
    assert entries["beta"] == {"f:metadata": {"f:finalizers": {'v:"b/y"': {}}}}


def test_an_update_owns_the_field_of_the_item_it_changed():
    owners = fm.Ownership()
    obj = fm.apply(None, pods({"name": "main", "image": "web:1"}), owners, "op", force=True)
    edited = copy.deepcopy(obj)
    containers(edited)[0]["image"] = "web:0"
    fm.update(obj, edited, owners, "kubectl")
    assert owners.fields[fm.Manager("kubectl", "Update")] == {
        fm.path(*CONTAINERS, {"name": "main"}, "image")
    }
    again = fm.apply(edited, pods({"name": "main", "image": "web:1"}), owners, "op", force=True)
    assert containers(again)[0]["image"] == "web:1"
    assert fm.Manager("kubectl", "Update") not in owners.fields


def test_a_custom_resource_is_typed_by_its_crd():
    """The InferenceService's conditions are a list-map keyed by type (the CRD says so)."""
    isvc = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": "chat"}}  # fmt: skip
    ready = {"type": "Ready", "status": "True", "reason": "Ready", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}  # fmt: skip
    new = {**isvc, "status": {"conditions": [ready]}}
    fm.register_crd(load_crd())
    owners = fm.Ownership()
    fm.update(isvc, new, owners, "sluice-operator", subresource="status")
    condition = fm.path("status", "conditions", {"type": "Ready"}, "status")
    assert owners.owners(condition) == [fm.Manager("sluice-operator", "Update", "status")]


# -- managedFields ----------------------------------------------------------------------


def test_managed_fields_are_a_fields_v1_trie():
    paths = [fm.path("spec", "replicas"), fm.path("spec", "template", "spec"),
             fm.path(*CONTAINERS, {"name": "a"}), fm.path(*CONTAINERS, {"name": "a"}, "image")]  # fmt: skip
    trie = fm.fields_v1(paths)
    assert trie == {"f:spec": {"f:replicas": {}, "f:template": {"f:spec": {".": {}, "f:containers": {
        'k:{"name":"a"}': {".": {}, "f:image": {}}}}}}}  # fmt: skip
    assert fm.parse_fields_v1(trie) == set(paths)


def test_paths_print_as_the_api_server_prints_them():
    port = fm.path("spec", "ports", {"protocol": "TCP", "port": 80}, "name")
    assert port[2] == 'k:{"port":80,"protocol":"TCP"}'  # keys sorted, as fieldsV1 writes them
    assert fm.path_string(port) == '.spec.ports[port=80,protocol="TCP"].name'
    assert (
        fm.path_string(("f:metadata", "f:finalizers", 'v:"a/x"')) == '.metadata.finalizers[="a/x"]'
    )
