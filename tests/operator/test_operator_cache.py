"""The watch cache (cache.py) and the apply skip (drift.py), without a server."""

from __future__ import annotations

import copy

from sluice.operator.cache import Cache
from sluice.operator.drift import stamped, up_to_date


def obj(kind="HorizontalPodAutoscaler", rv="5", uid="u1", **rest):
    return {"kind": kind, "metadata": {"name": "chat", "namespace": "ml", "uid": uid,
            "resourceVersion": rv}, **rest}  # fmt: skip


def test_an_hpa_metrics_write_is_not_worth_a_reconcile_but_a_scaling_problem_is():
    cache = Cache()
    assert cache.observe("ADDED", obj(status={"currentMetrics": [1]}))
    assert not cache.observe("MODIFIED", obj(rv="6", status={"currentMetrics": [2]}))
    problem = {"conditions": [{"type": "AbleToScale", "status": "False", "reason": "X"}]}
    assert cache.observe("MODIFIED", obj(rv="7", status=problem))
    assert cache.get("HorizontalPodAutoscaler", "ml", "chat")["status"] == problem


def test_status_is_relevant_where_it_is_read_and_spec_everywhere():
    cache = Cache()
    cache.observe("ADDED", obj("Deployment", status={"readyReplicas": 1}))
    assert cache.observe("MODIFIED", obj("Deployment", rv="6", status={"readyReplicas": 2}))
    cache.observe("ADDED", obj("Service", spec={"ports": [1]}))
    assert not cache.observe("MODIFIED", obj("Service", rv="6", spec={"ports": [1]},
                                             status={"loadBalancer": {}}))  # fmt: skip
    assert cache.observe("MODIFIED", obj("Service", rv="7", spec={"ports": [2]}))


def test_a_late_event_never_rolls_back_a_newer_write():
    cache = Cache()
    assert cache.remember(obj("Deployment", rv="10", spec={"replicas": 3}))
    assert not cache.observe("MODIFIED", obj("Deployment", rv="9", spec={"replicas": 2}))
    assert cache.get("Deployment", "ml", "chat")["spec"] == {"replicas": 3}
    # a re-created object (another uid) replaces whatever was known
    assert cache.observe("ADDED", obj("Deployment", rv="2", uid="u2", spec={"replicas": 1}))
    # and the deletion of the old one does not remove the new one
    assert not cache.observe("DELETED", obj("Deployment", rv="11", uid="u1"))
    assert cache.get("Deployment", "ml", "chat")["metadata"]["uid"] == "u2"


def test_selection_by_labels_and_a_fresh_listing_replaces_it():
    cache = Cache()
    for name, labels in (("a", {"app": "x", "t": "1"}), ("b", {"app": "x"}), ("c", {"app": "y"})):
        cache.remember({"kind": "Pod", "metadata": {"name": name, "namespace": "ml",
                        "labels": labels, "resourceVersion": "1"}})  # fmt: skip
    assert [p["metadata"]["name"] for p in cache.select("Pod", "ml", {"app": "x"})] == ["a", "b"]
    cache.replace("Pod", "ml", {"app": "x"}, [{"metadata": {"name": "d", "namespace": "ml",
                  "labels": {"app": "x"}, "resourceVersion": "2"}}])  # fmt: skip
    assert [p["metadata"]["name"] for p in cache.select("Pod", "ml", {})] == ["c", "d"]


DEPLOYMENT = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "chat", "namespace": "ml", "labels": {"a": "b"}},
    "spec": {
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "runtime",
                        "image": "img:1",
                        "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                        "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}},
                    }
                ]
            }
        }
    },
}


def stored(rendered):
    """As the API server would store an apply of `rendered`: defaults added, quantities as
    strings."""
    result = copy.deepcopy(stamped(rendered))
    result["metadata"] |= {"uid": "u1", "resourceVersion": "3", "managedFields": []}
    container = result["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = "1"
    container["imagePullPolicy"] = "IfNotPresent"
    result["spec"]["replicas"] = 1
    result["status"] = {"readyReplicas": 1}
    return result


def test_an_unchanged_rendering_is_not_applied():
    assert up_to_date(stamped(DEPLOYMENT), stored(DEPLOYMENT))


def test_a_removed_field_is_applied_so_the_apply_releases_it():
    smaller = copy.deepcopy(DEPLOYMENT)
    del smaller["spec"]["template"]["spec"]["containers"][0]["env"][1]
    assert not up_to_date(stamped(smaller), stored(DEPLOYMENT))  # the values alone would pass


def test_an_edit_by_someone_else_is_reverted():
    edited = stored(DEPLOYMENT)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "evil:1"
    assert not up_to_date(stamped(DEPLOYMENT), edited)
    edited = stored(DEPLOYMENT)
    del edited["metadata"]["labels"]["a"]
    assert not up_to_date(stamped(DEPLOYMENT), edited)


def test_an_injected_sidecar_is_not_drift():
    injected = stored(DEPLOYMENT)
    injected["spec"]["template"]["spec"]["containers"].append({"name": "istio-proxy"})
    assert up_to_date(stamped(DEPLOYMENT), injected)


def test_nothing_stored_is_never_up_to_date():
    assert not up_to_date(stamped(DEPLOYMENT), None)
