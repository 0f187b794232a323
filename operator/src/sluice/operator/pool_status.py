"""The conditions of a disaggregated service (spec.disaggregation): its two pools'
(conditions.py, each pool one Deployment) combined, and `status.disaggregation`.

  Ready        every pool Ready and a router replica available (requests reach the P/D
               pods only through the router); else the first pool's reason that is not,
               then the router's (its RouterReady reason: starting, or a pod's problem)
  Available    every pool has an available replica
  Progressing  a pool progresses (the first one's reason), else the first pool's that is
               not RolloutComplete (ProgressDeadlineExceeded, ...)
  Degraded     a pool is degraded (the first one's reason)

Messages name the pool they come from ("prefill: 1/1 replicas ..."); the counts are the
sums over the pools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import constants as c
from .conditions import Condition, PodsState

# reasons of a False Progressing or Degraded that say all is well
_SETTLED = frozenset({"RolloutComplete", "AsExpected"})
Named = Sequence[tuple[str, Condition]]  # (pool role, its condition)


def combine_pools(pools: Mapping[str, PodsState], *, router_down: Condition | None) -> PodsState:
    """`pools`: each pool's state, by role (prefill first); `router_down`: why no router
    replica is available (its RouterReady condition), None while one is."""
    states = list(pools.items())
    ready = _every([(role, state.ready) for role, state in states])
    if ready.status and router_down is not None:
        ready = Condition(
            c.CONDITION_READY, False, router_down.reason, _of("router", router_down).message
        )
    return PodsState(
        ready=ready,
        available=_every([(role, state.available) for role, state in states]),
        progressing=_some([(role, state.progressing) for role, state in states]),
        degraded=_some([(role, state.degraded) for role, state in states]),
        replicas=sum(state.replicas for _, state in states),
        ready_replicas=sum(state.ready_replicas for _, state in states),
        desired_replicas=sum(state.desired_replicas for _, state in states),
    )


def pools_status(pools: Mapping[str, PodsState]) -> dict[str, Any]:
    """`status.disaggregation`: each pool's counts, by role."""
    return {
        role: {
            "replicas": state.replicas,
            "readyReplicas": state.ready_replicas,
            "desiredReplicas": state.desired_replicas,
        }
        for role, state in pools.items()
    }


def _every(conditions: Named) -> Condition:
    """True when every pool's is; else the first pool's that is not."""
    for role, cond in conditions:
        if not cond.status:
            return _of(role, cond)
    first = conditions[0][1]
    return Condition(first.type, True, first.reason, _joined(conditions))


def _some(conditions: Named) -> Condition:
    """True when some pool's is (the first's); else the first pool's unsettled one."""
    for role, cond in conditions:
        if cond.status:
            return _of(role, cond)
    for role, cond in conditions:
        if cond.reason not in _SETTLED:
            return _of(role, cond)
    first = conditions[0][1]
    return Condition(first.type, False, first.reason, _joined(conditions))


def _of(role: str, cond: Condition) -> Condition:
    return Condition(cond.type, cond.status, cond.reason, f"{role}: {cond.message}")


def _joined(conditions: Named) -> str:
    return "; ".join(f"{role}: {cond.message}" for role, cond in conditions if cond.message)
