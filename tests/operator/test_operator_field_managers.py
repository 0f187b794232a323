"""The emulator's server-side apply against what the Kubernetes documentation says a real
API server does (https://kubernetes.io/docs/reference/using-api/server-side-apply/)."""

from __future__ import annotations

import field_managers as fm
import pytest

DEPLOYMENT = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}


def config(**spec) -> dict:
    return {**DEPLOYMENT, "spec": spec}


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
    assert owners.owners(("spec", "replicas")) == [
        fm.Manager("kube-controller-manager", "Update", "scale")
    ]


def test_changing_a_field_someone_else_owns_conflicts_unless_forced():
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3), owners, "op", force=True)
    fm.update(obj, {**obj, "spec": {"replicas": 5}}, owners, "kubectl")
    obj = {**obj, "spec": {"replicas": 5}}
    with pytest.raises(fm.ApplyConflict, match='conflict with "kubectl"'):
        fm.apply(obj, config(replicas=3), owners, "op", force=False)
    forced = fm.apply(obj, config(replicas=3), owners, "op", force=True)
    assert forced["spec"]["replicas"] == 3
    assert owners.owners(("spec", "replicas")) == [fm.Manager("op", "Apply")]


def test_fields_of_other_managers_survive_an_apply():
    owners = fm.Ownership()
    obj = fm.apply(None, config(replicas=3), owners, "op", force=True)
    annotated = {**obj, "metadata": {"name": "d", "annotations": {"note": "kept"}}}
    fm.update(obj, annotated, owners, "kubectl")
    again = fm.apply(annotated, config(replicas=3), owners, "op", force=True)
    assert again["metadata"]["annotations"] == {"note": "kept"}


def test_managed_fields_are_a_fields_v1_trie():
    assert fm.fields_v1([("spec", "replicas"), ("spec", "template", "spec")]) == {
        "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {}}}
    }
