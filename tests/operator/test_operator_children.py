"""Which existing objects block a reconcile (children.check_ownership, pure)."""

from __future__ import annotations

import pytest

from sluice.operator.children import Blocked, check_ownership, plan

OWNER = {"metadata": {"name": "chat", "namespace": "ml", "uid": "new-uid"}}


def child(uid: str | None, name: str = "chat", obj: str = "chat") -> dict:
    refs = [] if uid is None else [
        {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService", "name": name,
         "uid": uid, "controller": True}
    ]  # fmt: skip
    return {"metadata": {"name": obj, "ownerReferences": refs}}


def test_our_children_block_nothing(make_spec):
    check_ownership(
        plan(make_spec(), podmonitors=None), {("Deployment", "chat"): child("new-uid")}, OWNER
    )


def test_an_object_nobody_owns_is_a_name_conflict(make_spec):
    with pytest.raises(Blocked) as blocked:
        check_ownership(
            plan(make_spec(), podmonitors=None), {("Service", "chat"): child(None)}, OWNER
        )
    assert blocked.value.reason == "NameConflict"
    assert "Service ml/chat exists and is not owned" in str(blocked.value)


def test_an_orphan_of_this_service_is_adopted_not_a_conflict(make_spec):
    ours = {"app.kubernetes.io/managed-by": "sluice-operator", "app.kubernetes.io/instance": "chat"}
    orphan = {"metadata": {"name": "chat", "labels": ours}}
    check_ownership(plan(make_spec(), podmonitors=None), {("Deployment", "chat"): orphan}, OWNER)
    # another service's orphan, or an object merely labelled ours but owned, still blocks
    theirs = {"metadata": {"name": "chat", "labels": {**ours, "app.kubernetes.io/instance": "x"}}}
    with pytest.raises(Blocked):
        check_ownership(plan(make_spec(), podmonitors=None), {("Deployment", "chat"): theirs}, OWNER)
    owned = {**child("old-uid"), "metadata": {**child("old-uid")["metadata"], "labels": ours}}
    with pytest.raises(Blocked) as blocked:
        check_ownership(plan(make_spec(), podmonitors=None), {("Deployment", "chat"): owned}, OWNER)
    assert blocked.value.reason == "WaitingForGarbageCollection"


def test_a_deleted_predecessors_child_is_waited_for(make_spec):
    with pytest.raises(Blocked) as blocked:
        check_ownership(
            plan(make_spec(), podmonitors=None), {("Deployment", "chat"): child("old-uid")}, OWNER
        )
    assert blocked.value.reason == "WaitingForGarbageCollection"


def test_someone_elses_object_of_a_kind_we_would_remove_is_left_alone(make_spec):
    the_plan = plan(make_spec(), podmonitors=None)  # autoscaling off: the HPA kind is removed
    check_ownership(the_plan, {("HorizontalPodAutoscaler", "chat"): child(None)}, OWNER)


def test_someone_elses_router_service_account_is_a_name_conflict(make_spec):
    the_plan = plan(make_spec(router={"enabled": True}), podmonitors=None)
    existing = {("ServiceAccount", "chat-router"): child(None, obj="chat-router")}
    with pytest.raises(Blocked) as blocked:
        check_ownership(the_plan, existing, OWNER)
    assert blocked.value.reason == "NameConflict"
    assert "ServiceAccount ml/chat-router exists and is not owned" in str(blocked.value)


def test_someone_elses_router_is_left_alone_while_ours_is_off(make_spec):
    the_plan = plan(make_spec(), podmonitors=None)  # router off: its objects are removed
    existing = {("Deployment", "chat-router"): child(None, obj="chat-router")}
    check_ownership(the_plan, existing, OWNER)
