"""Kubernetes' HorizontalPodAutoscaler, reproduced: the replica calculator and the
controller's normalisation, as `pkg/controller/podautoscaler` (replica_calculator.go,
horizontal.go) computes them, step for step, with its integer milli-value arithmetic.

- `desired = ceil(current × metric / target)` per metric, skipped within the tolerance
  (0.1), with pods set aside: deleted/failed pods ignored, pending pods (and for CPU, pods
  not yet ready within their initialisation period) "unready", pods without a sample
  "missing"; missing pods count as the target on a scale-down and 0 on a scale-up,
  unready ones as 0 on a scale-up; a recomputed ratio that flips direction or falls
  within the tolerance keeps the current count.
- External metrics with an AverageValue target: `ceil(sum / target)` when
  `sum / (target × status replicas)` is outside the tolerance.
- The largest desire over the metrics; no scaling when every metric failed, or some
  failed and the rest would scale down.
- Behaviour: the stabilisation window (scale-up: the lowest recommendation in its window,
  scale-down: the highest), then the rate policies (Pods/Percent over periodSeconds,
  counted from the scale events of both directions in each period, selectPolicy
  Max/Min/Disabled), then min/max replicas.

The defaults are Kubernetes': sync every 15 s, tolerance 0.1, scale-down window 300 s,
scale-up 0 s; scale-up policies 100% or 4 pods per 15 s (Max), scale-down 100% per 15 s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

TOLERANCE = 0.1
SYNC_PERIOD_S = 15.0
CPU_INITIALIZATION_PERIOD_S = 300.0  # --horizontal-pod-autoscaler-cpu-initialization-period
INITIAL_READINESS_DELAY_S = 30.0  # --horizontal-pod-autoscaler-initial-readiness-delay
SELECT_MAX, SELECT_MIN, SELECT_DISABLED = "Max", "Min", "Disabled"
PODS, PERCENT = "Pods", "Percent"


def milli(value: float) -> int:
    """A Kubernetes quantity's MilliValue (rounded up, as `resource.Quantity` does)."""
    return int(math.ceil(round(value * 1000.0, 6)))


@dataclass(frozen=True)
class ScalingPolicy:
    type: str  # Pods | Percent
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_seconds: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: str = SELECT_MAX


DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy(PERCENT, 100, 15), ScalingPolicy(PODS, 4, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(300, (ScalingPolicy(PERCENT, 100, 15),))


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN


def rules(
    window: int | None, default: ScalingRules, policies: Sequence[ScalingPolicy] = (), select: str | None = None
) -> ScalingRules:
    """Rules as the API server defaults a partly given `behavior` (unset fields: defaults)."""
    return ScalingRules(
        default.stabilization_window_seconds if window is None else window,
        tuple(policies) or default.policies,
        select or default.select_policy,
    )


# ---- what the controller sees of the pods -----------------------------------------------
@dataclass(frozen=True)
class PodView:
    name: str
    phase: str  # Pending | Running | Failed | Succeeded
    ready: bool = False
    deleting: bool = False
    start_time: float | None = None  # status.startTime
    ready_transition: float | None = None  # the Ready condition's lastTransitionTime
    cpu_request_milli: int = 1000

    @property
    def terminal(self) -> bool:
        return self.phase in ("Failed", "Succeeded")


@dataclass(frozen=True)
class CpuSample:
    usage_milli: int
    timestamp: float
    window: float


def group_pods(
    pods: Sequence[PodView],
    metrics: dict[str, object],
    cpu: bool,
    now: float,
    cpu_init_period: float = CPU_INITIALIZATION_PERIOD_S,
    readiness_delay: float = INITIAL_READINESS_DELAY_S,
) -> tuple[int, set[str], set[str], set[str]]:
    """replica_calculator.go groupPods: (ready count, unready, missing, ignored)."""
    ready = 0
    unready: set[str] = set()
    missing: set[str] = set()
    ignored: set[str] = set()
    for pod in pods:
        if pod.deleting or pod.terminal:
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        metric = metrics.get(pod.name)
        if metric is None:
            missing.add(pod.name)
            continue
        if cpu:
            assert isinstance(metric, CpuSample)
            if pod.ready_transition is None or pod.start_time is None:
                is_unready = True
            elif pod.start_time + cpu_init_period > now:
                is_unready = (not pod.ready) or metric.timestamp < pod.ready_transition + metric.window
            else:
                is_unready = (not pod.ready) and pod.start_time + readiness_delay > pod.ready_transition
            if is_unready:
                unready.add(pod.name)
                continue
        ready += 1
    return ready, unready, missing, ignored


class MetricError(Exception):
    """The metric could not be turned into a replica count (the HPA's FailedGet...)."""


def within(ratio: float, tolerance: float) -> bool:
    """Tolerances.isWithin (Kubernetes 1.33+): no change while 1-tol <= ratio <= 1+tol."""
    return 1.0 - tolerance <= ratio <= 1.0 + tolerance


def _usage_ratio(values: dict[str, int], target: int) -> tuple[float, int]:
    """metrics.GetMetricUsageRatio: integer average of milli-values over the target."""
    total = sum(values.values())
    usage = total // len(values)  # int64 division (values are non-negative here)
    return usage / target, usage


def plain_metric_replicas(
    pods: Sequence[PodView],
    values: dict[str, float],
    current_replicas: int,
    target: float,
    now: float,
    tolerance: float = TOLERANCE,
) -> int:
    """calcPlainMetricReplicas: a Pods metric with an AverageValue target."""
    if not pods:
        raise MetricError("no pods returned by selector while calculating replica count")
    metrics = {name: milli(v) for name, v in values.items()}
    target_m = milli(target)
    ready, unready, missing, ignored = group_pods(pods, metrics, cpu=False, now=now)
    for name in ignored | unready:
        metrics.pop(name, None)
    if not metrics:
        raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
    ratio, _ = _usage_ratio(metrics, target_m)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if within(ratio, tolerance):
            return current_replicas
        return int(math.ceil(ratio * ready))
    if missing:
        fill = target_m if ratio < 1.0 else 0
        if ratio != 1.0:
            for name in missing:
                metrics[name] = fill
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0
    new_ratio, _ = _usage_ratio(metrics, target_m)
    return _after_fill(ratio, new_ratio, len(metrics), current_replicas, tolerance)


def _after_fill(
    ratio: float, new_ratio: float, counted: int, current_replicas: int, tolerance: float
) -> int:
    """The count once missing and unready pods are filled in (both calculators share it):
    unchanged when the filled-in ratio is within tolerance or reverses the direction of
    the change, or when the new count would move the other way."""
    if within(new_ratio, tolerance) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return current_replicas
    new_replicas = int(math.ceil(new_ratio * counted))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (
        new_ratio > 1.0 and new_replicas < current_replicas
    ):
        return current_replicas
    return new_replicas


def resource_utilisation_replicas(
    pods: Sequence[PodView],
    samples: dict[str, CpuSample],
    current_replicas: int,
    target_utilisation: int,
    now: float,
    tolerance: float = TOLERANCE,
) -> int:
    """GetResourceReplicas: CPU with a Utilization target (percent of the request)."""
    if not pods:
        raise MetricError("no pods returned by selector while calculating replica count")
    ready, unready, missing, ignored = group_pods(pods, dict(samples), cpu=True, now=now)
    metrics = {n: s.usage_milli for n, s in samples.items() if n not in ignored | unready}
    if not metrics:
        raise MetricError("did not receive metrics for targeted pods (pods might be unready)")
    requests = {p.name: p.cpu_request_milli for p in pods}

    def ratio_of(m: dict[str, int]) -> float:
        used = sum(v for n, v in m.items() if n in requests)
        asked = sum(requests[n] for n in m if n in requests)
        if asked == 0:
            raise MetricError("no metrics returned matched known pods")
        utilisation = (used * 100) // asked
        return utilisation / target_utilisation

    ratio = ratio_of(metrics)
    scale_up_with_unready = bool(unready) and ratio > 1.0
    if not scale_up_with_unready and not missing:
        if within(ratio, tolerance):
            return current_replicas
        return int(math.ceil(ratio * ready))
    if missing:
        if ratio < 1.0:
            fallback = max(100, target_utilisation)
            for name in missing:
                metrics[name] = requests[name] * fallback // 100
        elif ratio > 1.0:
            for name in missing:
                metrics[name] = 0
    if scale_up_with_unready:
        for name in unready:
            metrics[name] = 0
    new_ratio = ratio_of(metrics)
    return _after_fill(ratio, new_ratio, len(metrics), current_replicas, tolerance)


def external_per_pod_replicas(
    values: Sequence[float], status_replicas: int, target_per_pod: float, tolerance: float = TOLERANCE
) -> int:
    """GetExternalPerPodMetricReplicas: an External metric with an AverageValue target
    (the sum of the matching series over the target)."""
    if not values:
        raise MetricError("unable to get external metric: no series")
    usage = sum(milli(v) for v in values)
    target_m = milli(target_per_pod)
    replicas = status_replicas
    ratio = usage / (target_m * replicas) if replicas else math.inf
    if not within(ratio, tolerance):
        replicas = int(math.ceil(usage / target_m))
    return replicas


# ---- the controller -----------------------------------------------------------------------
@dataclass
class _Recommendation:
    replicas: int
    at: float


@dataclass
class _ScaleEvent:
    change: int
    at: float
    outdated: bool = False


MetricFn = Callable[[int, int], int]  # (spec replicas, status replicas) -> desired; may raise


@dataclass
class HorizontalController:
    """One HPA's controller state (recommendations, scale events) and its reconcile."""

    min_replicas: int
    max_replicas: int
    behavior: Behavior = field(default_factory=Behavior)
    recommendations: list[_Recommendation] = field(default_factory=list)
    up_events: list[_ScaleEvent] = field(default_factory=list)
    down_events: list[_ScaleEvent] = field(default_factory=list)

    def reconcile(
        self, now: float, spec_replicas: int, status_replicas: int, metrics: Sequence[MetricFn]
    ) -> int:
        """The replica count the HPA sets on the scale subresource (= `spec_replicas` when
        it does not rescale)."""
        current = spec_replicas
        if not self.recommendations:
            self.recommendations.append(_Recommendation(current, now))
        if spec_replicas == 0 and self.min_replicas != 0:
            return 0  # autoscaling disabled for this target
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            proposal = self._replicas_for_metrics(spec_replicas, status_replicas, metrics)
            if proposal is None:
                return current
            desired = self._normalize(now, current, proposal)
        if desired != current:
            self._store_event(now, current, desired)
        return desired

    @staticmethod
    def _replicas_for_metrics(spec: int, status: int, metrics: Sequence[MetricFn]) -> int | None:
        replicas, invalid = 0, 0
        for fn in metrics:
            try:
                replicas = max(replicas, fn(spec, status))
            except MetricError:
                invalid += 1
        if invalid >= len(metrics) or (invalid > 0 and replicas < spec):
            return None
        return replicas

    def _normalize(self, now: float, current: int, desired: int) -> int:
        stabilized = self._stabilize(now, current, desired)
        return self._rate_limited(now, current, stabilized)

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cut = now - self.behavior.scale_up.stabilization_window_seconds
        down_cut = now - self.behavior.scale_down.stabilization_window_seconds
        up, down = desired, desired
        old = None
        for i, rec in enumerate(self.recommendations):
            if rec.at > up_cut:
                up = min(rec.replicas, up)
            if rec.at > down_cut:
                down = max(rec.replicas, down)
            if rec.at < up_cut and rec.at < down_cut:
                old = i
        recommendation = current
        if recommendation < up:
            recommendation = up
        if recommendation > down:
            recommendation = down
        if old is not None:
            self.recommendations[old] = _Recommendation(desired, now)
        else:
            self.recommendations.append(_Recommendation(desired, now))
        return recommendation

    def _changes_in_period(self, events: list[_ScaleEvent], period: int, now: float) -> int:
        cut = now - period
        return sum(e.change for e in events if e.at > cut)

    def _rate_limited(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = self._scale_up_limit(now, current)
            limit = max(limit, current)
            return min(desired, min(self.max_replicas, limit))
        if desired < current:
            limit = self._scale_down_limit(now, current)
            limit = min(limit, current)
            return max(desired, max(self.min_replicas, limit))
        return desired

    def _scale_up_limit(self, now: float, current: int) -> int:
        r = self.behavior.scale_up
        if r.select_policy == SELECT_DISABLED:
            return current
        pick, result = (min, 2**31 - 1) if r.select_policy == SELECT_MIN else (max, -(2**31))
        for p in r.policies:
            start = current - self._changes_in_period(self.up_events, p.period_seconds, now) + \
                self._changes_in_period(self.down_events, p.period_seconds, now)  # fmt: skip
            if p.type == PODS:
                proposed = start + p.value
            else:
                proposed = int(math.ceil(start * (1 + p.value / 100)))
            result = pick(result, proposed)
        return result

    def _scale_down_limit(self, now: float, current: int) -> int:
        r = self.behavior.scale_down
        if r.select_policy == SELECT_DISABLED:
            return current
        pick, result = (max, -(2**31)) if r.select_policy == SELECT_MIN else (min, 2**31 - 1)
        for p in r.policies:
            start = current - self._changes_in_period(self.up_events, p.period_seconds, now) + \
                self._changes_in_period(self.down_events, p.period_seconds, now)  # fmt: skip
            if p.type == PODS:
                proposed = start - p.value
            else:
                proposed = int(start * (1 - p.value / 100))
            result = pick(result, proposed)
        return result

    def _store_event(self, now: float, previous: int, new: int) -> None:
        if new > previous:
            events, longest, change = self.up_events, _longest(self.behavior.scale_up), new - previous
        else:
            events, longest, change = self.down_events, _longest(self.behavior.scale_down), previous - new
        cut = now - longest
        for e in events:
            if e.at < cut:
                e.outdated = True
        last_outdated = None
        for i, e in enumerate(events):
            if e.outdated:
                last_outdated = i
        if last_outdated is not None:
            events[last_outdated] = _ScaleEvent(change, now)
        else:
            events.append(_ScaleEvent(change, now))


def _longest(r: ScalingRules) -> int:
    return max((p.period_seconds for p in r.policies), default=0)
