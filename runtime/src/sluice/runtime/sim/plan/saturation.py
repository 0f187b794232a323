"""The saturation policy, as the shipped recording rule computes it
(`monitoring/prometheus/saturation.yaml`; tests check the two agree through a real
Prometheus), in the style of llm-d's saturation analyzer:

1. per pod, the peaks over the last minute: `kv = max_over_time(sluice_kv_token_usage[1m])`,
   `queue = max_over_time(sluice_queue_requests[1m])`; the pods are those with samples in
   that minute (`N`);
2. a pod is saturated when `kv >= kv_threshold` or `queue >= queue_threshold`;
3. over the unsaturated pods: average spare `kv_threshold - kv` and `queue_threshold -
   queue`; scale up when either falls below its trigger, or when every pod is saturated;
4. scale down only when at least two pods are unsaturated and their total load spread over
   one pod fewer still leaves both spares at or above their triggers;
5. desired replicas: `N + 1`, `N - 1` or `N`.

The HPA reads the desired count as an External metric with an AverageValue target of 1,
so it sets `ceil(desired)` replicas when that differs from the current count by more than
its tolerance (see `hpa.external_per_pod_replicas`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.runtime.constants import (
    SATURATION_KV_SPARE_TRIGGER,
    SATURATION_KV_THRESHOLD,
    SATURATION_QUEUE_SPARE_TRIGGER,
    SATURATION_QUEUE_THRESHOLD,
)


@dataclass(frozen=True)
class SaturationConfig:
    kv_threshold: float = SATURATION_KV_THRESHOLD
    queue_threshold: float = SATURATION_QUEUE_THRESHOLD
    kv_spare_trigger: float = SATURATION_KV_SPARE_TRIGGER
    queue_spare_trigger: float = SATURATION_QUEUE_SPARE_TRIGGER
    window_s: float = 60.0


@dataclass(frozen=True)
class PodPeak:
    kv: float
    queue: float


def desired_replicas(pods: Sequence[PodPeak], config: SaturationConfig) -> int | None:
    """The recorded value for one service; None when no pod reported (no series)."""
    if not pods:
        return None
    n = len(pods)
    free = [p for p in pods if p.kv < config.kv_threshold and p.queue < config.queue_threshold]
    if not free:
        return n + 1
    spare_kv = sum(config.kv_threshold - p.kv for p in free) / len(free)
    spare_queue = sum(config.queue_threshold - p.queue for p in free) / len(free)
    if spare_kv < config.kv_spare_trigger or spare_queue < config.queue_spare_trigger:
        return n + 1
    if len(free) >= 2:
        rest = len(free) - 1
        kv_after = config.kv_threshold - sum(p.kv for p in free) / rest
        queue_after = config.queue_threshold - sum(p.queue for p in free) / rest
        if kv_after >= config.kv_spare_trigger and queue_after >= config.queue_spare_trigger:
            return n - 1
    return n


def peaks(samples: dict[str, list[tuple[float, float, float]]], now: float, window_s: float) -> list[PodPeak]:
    """Per pod, the maxima of its (time, kv, queue) samples in (now - window, now]."""
    out = []
    for series in samples.values():
        recent = [(kv, q) for t, kv, q in series if now - window_s < t <= now]
        if recent:
            out.append(PodPeak(max(kv for kv, _ in recent), max(q for _, q in recent)))
    return out
