"""Who sets Deployment.spec.replicas, and how it changes hands without losing a pod.

Autoscaling off: the operator applies `spec.replicas`. Autoscaling on: the HPA owns the
field. Server-side apply makes the switch dangerous: a field released by its only manager
is reset to its default (1 for a Deployment), so merely leaving `replicas` out of the
applied Deployment would kill all but one loaded pod before the HPA scales back up. The
hand-over is the documented one
(https://kubernetes.io/docs/reference/using-api/server-side-apply/#transferring-ownership):

- on: apply the current count (at least `minReplicas`: an HPA never scales a target at
  0, so `replicas: 0` turned autoscaled would stay at 0 forever) under a second field
  manager (`HANDOVER_FIELD_MANAGER`, not forced: a conflict means the HPA owns the field
  already), then apply the
  Deployment without `replicas`; the field stays, co-owned by the hand-over manager, until
  the HPA writes it and becomes its owner (the hand-over manager then owns nothing and
  disappears). A Deployment created under autoscaling starts with `replicas` clamped to
  [minReplicas, maxReplicas].
- off: the operator takes the field back starting from the HPA's last count: if
  `spec.replicas` did not change since the Deployment was last applied (recorded in the
  `sluice.dev/spec-replicas` annotation), the count is written into `spec.replicas`
  through the InferenceService's scale subresource (as `kubectl scale` would) and kept;
  if the same edit set `spec.replicas`, that value wins. The hand-over manager then
  releases the field (an apply that owns nothing), should it still co-own it.

With spec.disaggregation each pool's Deployment is decided alike, from the pool's view of
the spec (its replicas and autoscaling), except that turning a pool's autoscaling off goes
to the pool's `replicas` at once (there is no scale subresource to write the count into).

The decision is pure (`decide`); the reconcile carries it out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import constants as c
from .kube import DEPLOYMENTS, HPAS
from .spec import InferenceServiceSpec


@dataclass(frozen=True)
class ReplicasPlan:
    deployment_replicas: int | None  # what the operator applies (None: leave it out)
    handover: int | None = None  # apply this count under the hand-over manager first
    copy_to_spec: int | None = None  # write this into the InferenceService's spec.replicas
    release_handover: bool = False  # after applying, the hand-over manager lets go


def field_owners(obj: Mapping[str, Any] | None, *path: str) -> set[str]:
    """Field managers that own `path` of `obj`, from metadata.managedFields."""
    owners = set()
    for entry in ((obj or {}).get("metadata") or {}).get("managedFields") or []:
        node: Any = entry.get("fieldsV1") or {}
        for key in path:
            node = node.get(f"f:{key}") if isinstance(node, Mapping) else None
            if node is None:
                break
        else:
            owners.add(entry.get("manager", ""))
    return owners


def decide(
    isvc: InferenceServiceSpec,
    deployment: Mapping[str, Any] | None,
    *,
    hpa_exists: bool,
) -> ReplicasPlan:
    if deployment is None:
        if isvc.autoscaling.enabled:
            return ReplicasPlan(isvc.autoscaled_start_replicas)
        return ReplicasPlan(isvc.replicas)
    current = (deployment.get("spec") or {}).get("replicas", 1)
    owners = field_owners(deployment, "spec", "replicas")
    ours = {c.FIELD_MANAGER, c.HANDOVER_FIELD_MANAGER}
    if isvc.autoscaling.enabled:
        if owners - ours:  # the HPA (or someone) owns it: nothing to hand over
            return ReplicasPlan(None)
        # an HPA never scales a target at 0 replicas: hand over at least minReplicas
        start = max(current, isvc.autoscaling.min_replicas)
        if c.HANDOVER_FIELD_MANAGER in owners and current == start:
            return ReplicasPlan(None)  # handed over already, the HPA has not written yet
        return ReplicasPlan(None, handover=start)
    release = c.HANDOVER_FIELD_MANAGER in owners
    if not (hpa_exists or release) or current == isvc.replicas or isvc.role is not None:
        # (a P/D pool has no scale subresource to keep the HPA's count in: its own
        # `replicas` applies at once)
        return ReplicasPlan(isvc.replicas, release_handover=release)
    recorded = ((deployment.get("metadata") or {}).get("annotations") or {}).get(
        c.ANNOTATION_SPEC_REPLICAS
    )
    if recorded is not None and recorded != str(isvc.replicas):
        # the same edit asked for a count: it wins
        return ReplicasPlan(isvc.replicas, release_handover=release)
    return ReplicasPlan(current, copy_to_spec=current, release_handover=release)


def decide_for(
    view: InferenceServiceSpec,
    children: Mapping[tuple[str, str], Mapping[str, Any] | None],
    ours: Callable[[Mapping[str, Any]], bool],
) -> ReplicasPlan:
    """`decide` for the runtime Deployment of `view` (the service, or a P/D pool's view of
    it), from the children that exist by (kind, name); `ours`: whether this service owns
    one."""
    name = view.runtime_name
    hpa = children.get((HPAS.kind, name))
    return decide(
        view, children.get((DEPLOYMENTS.kind, name)), hpa_exists=hpa is not None and ours(hpa)
    )


def handover_object(name: str, namespace: str, replicas: int | None) -> dict[str, Any]:
    """The partial Deployment the hand-over manager applies: only the replica count, or
    nothing at all (which releases the field)."""
    obj: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
    }
    if replicas is not None:
        obj["spec"] = {"replicas": replicas}
    return obj
