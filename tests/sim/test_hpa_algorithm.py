"""The HPA model against Kubernetes' own documentation: every case is a statement of
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/ (algorithm
details, scaling policies, stabilization window, default behavior, the examples), turned
into numbers. The quoted sentence is the oracle."""

from __future__ import annotations

import pytest

from sluice.runtime.sim.plan.hpa import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    PERCENT,
    PODS,
    SELECT_DISABLED,
    SELECT_MIN,
    Behavior,
    CpuSample,
    HorizontalController,
    MetricError,
    PodView,
    ScalingPolicy,
    external_per_pod_replicas,
    plain_metric_replicas,
    resource_utilisation_replicas,
    rules,
)


def ready_pods(n: int, prefix: str = "p") -> list[PodView]:
    return [PodView(f"{prefix}{i}", "Running", ready=True, start_time=-1000.0, ready_transition=-990.0)
            for i in range(n)]  # fmt: skip


def pods_metric(value: float, target: float) -> object:
    """A Pods metric whose every pod reports `value` (the controller's MetricFn)."""

    def fn(spec: int, status: int) -> int:
        pods = ready_pods(spec)
        return plain_metric_replicas(pods, {p.name: value for p in pods}, spec, target, now=0.0)

    return fn


# "if the current metric value is 200m, and the desired value is 100m, the number of replicas
# will be doubled, since 200.0 / 100.0 == 2.0. If the current value is instead 50m, you'll
# halve the number of replicas, since 50.0 / 100.0 == 0.5. The control plane skips any
# scaling action if the ratio is sufficiently close to 1.0 (within a globally-configurable
# tolerance, 0.1 by default)."
@pytest.mark.parametrize(
    "current, value, target, desired",
    [
        (4, 0.2, 0.1, 8),  # doubled
        (4, 0.05, 0.1, 2),  # halved
        (5, 0.05, 0.1, 3),  # ceil(5 * 0.5)
        (4, 0.109, 0.1, 4),  # within the tolerance: skipped
        (4, 0.091, 0.1, 4),
        (4, 0.111, 0.1, 5),  # just outside: ceil(4 * 1.11)
        (3, 12.0, 8.0, 5),  # queue depth 12 per pod against a target of 8: ceil(3 * 1.5)
        (2, 0.95, 0.8, 3),  # KV usage 95% against 80%: ceil(2 * 1.1875)
    ],
)
def test_desired_replicas_is_ceil_current_times_metric_over_target(current, value, target, desired):
    pods = ready_pods(current)
    assert plain_metric_replicas(pods, {p.name: value for p in pods}, current, target, now=0.0) == desired


# "If there were any missing metrics, the control plane recomputes the average more
# conservatively, assuming those pods were consuming 100% of the desired value in case of a
# scale down, and 0% in case of a scale up."
def test_missing_metrics_count_as_the_target_on_a_scale_down():
    pods = ready_pods(4)
    values = {"p0": 2.0, "p1": 2.0, "p2": 2.0}  # p3 has no sample; target 8
    # without p3: ratio 0.25 -> 1 replica; with p3 at the target: (2+2+2+8)/4/8 = 0.4375 -> 2
    assert plain_metric_replicas(pods, values, 4, 8.0, now=0.0) == 2


def test_missing_metrics_count_as_zero_on_a_scale_up():
    pods = ready_pods(4)
    values = {"p0": 16.0, "p1": 16.0, "p2": 16.0}  # p3 missing
    # without p3: ratio 2 -> 6; with p3 at 0: 12/8 = 1.5 -> ceil(1.5 * 4) = 6
    assert plain_metric_replicas(pods, values, 4, 8.0, now=0.0) == 6
    values = {"p0": 9.0, "p1": 9.0, "p2": 9.0}
    # ratio 1.125 scales up; with p3 at 0 the average is 6.75: 0.84 reverses the direction
    # ("If the new ratio reverses the scale direction ... doesn't take any scaling action")
    assert plain_metric_replicas(pods, values, 4, 8.0, now=0.0) == 4


# "if any not-yet-ready pods were present, and the workload would have scaled up without
# factoring in missing metrics or not-yet-ready pods, the controller conservatively assumes
# that the not-yet-ready pods are consuming 0% of the desired metric"
def test_pending_pods_count_as_zero_on_a_scale_up_and_are_left_out_otherwise():
    pods = ready_pods(2) + [PodView("new", "Pending")]
    assert plain_metric_replicas(pods, {"p0": 24.0, "p1": 24.0}, 3, 8.0, now=0.0) == 6  # 48/3/8 = 2
    assert plain_metric_replicas(pods, {"p0": 2.0, "p1": 2.0}, 3, 8.0, now=0.0) == 1  # 0.25 * 2 ready


# "All Pods with a deletion timestamp set ... are ignored, and all failed Pods are discarded."
def test_deleted_and_failed_pods_are_ignored():
    pods = ready_pods(2) + [PodView("gone", "Running", ready=True, deleting=True), PodView("dead", "Failed")]
    values = {"p0": 16.0, "p1": 16.0, "gone": 100.0}
    assert plain_metric_replicas(pods, values, 4, 8.0, now=0.0) == 4  # ratio 2 over 2 ready


def test_no_sample_from_any_counted_pod_is_an_error():
    with pytest.raises(MetricError):
        plain_metric_replicas([PodView("a", "Pending")], {}, 1, 8.0, now=0.0)


# "When scaling on CPU, if any pod has yet to become ready (it's still initializing, or
# possibly is unhealthy) *or* the most recent metric point for the pod was before it became
# ready, that pod is set aside as well."
def test_cpu_sets_aside_pods_not_ready_and_samples_from_before_ready():
    now = 100.0
    pods = [
        PodView("old", "Running", ready=True, start_time=0.0, ready_transition=10.0),
        PodView("loading", "Running", ready=False, start_time=90.0, ready_transition=90.0),
        PodView("fresh", "Running", ready=True, start_time=60.0, ready_transition=95.0),
    ]
    samples = {
        "old": CpuSample(1800, timestamp=99.0, window=15.0),  # 180% of a 1-CPU request
        "loading": CpuSample(1000, timestamp=99.0, window=15.0),
        "fresh": CpuSample(1000, timestamp=99.0, window=15.0),  # sample window starts before ready
    }
    # only "old" counts: 180 / 90 = 2.0, scale-up with 2 unready pods at 0%: 1800/3000 = 0.6
    # -> 60/90 = 0.67 reverses direction -> keep 3
    assert resource_utilisation_replicas(pods, samples, 3, 90, now) == 3
    samples["old"] = CpuSample(1000, 99.0, 15.0)
    pods2 = [pods[0], PodView("b", "Running", ready=True, start_time=0.0, ready_transition=10.0)]
    both = {"old": CpuSample(1000, 99.0, 15.0), "b": CpuSample(800, 99.0, 15.0)}
    # (1000 + 800) * 100 / 2000 = 90% against 45%: doubled
    assert resource_utilisation_replicas(pods2, both, 2, 45, now) == 4


# "For object metrics and external metrics, a single metric is fetched ... In the
# autoscaling/v2 API version, this value can optionally be divided by the number of Pods
# before the comparison is made." (AverageValue)
@pytest.mark.parametrize(
    "values, status, target, desired",
    [([3.0], 2, 1.0, 3), ([2.0], 2, 1.0, 2), ([2.1], 2, 1.0, 2), ([5.0], 4, 1.0, 5), ([1.0, 1.0], 3, 1.0, 2)],
)
def test_external_average_value_divides_the_sum_by_the_target(values, status, target, desired):
    assert external_per_pod_replicas(values, status, target) == desired


# "If multiple metrics are specified ... the largest of the desired replica counts is chosen.
# If any of these metrics cannot be converted into a desired replica count ... and a scale
# down is suggested by the metrics which can be fetched, scaling is skipped. This means that
# the HPA is still capable of scaling up if one or more metrics give a desiredReplicas
# greater than the current value."
def failing(spec: int, status: int) -> int:
    raise MetricError("unable to fetch metrics")


@pytest.mark.parametrize(
    "metrics, desired",
    [
        ([pods_metric(16.0, 8.0), pods_metric(0.4, 0.8)], 8),  # max(8, 2)
        ([failing, pods_metric(16.0, 8.0)], 8),  # a failed metric does not stop a scale-up
        ([failing, pods_metric(2.0, 8.0)], 4),  # ... but does stop a scale-down
        ([failing, failing], 4),  # nothing to go on
    ],
)
def test_multiple_metrics_take_the_largest_and_failures_block_scale_down(metrics, desired):
    hpa = HorizontalController(1, 20, Behavior(scale_down=rules(0, DEFAULT_SCALE_DOWN)))
    assert hpa.reconcile(0.0, 4, 4, metrics) == desired


def run(hpa: HorizontalController, steps: list[tuple[float, float]], target: float, start: int) -> list[int]:
    """Reconcile at each (time, per-pod metric value); the HPA's count is applied at once."""
    replicas, seen = start, []
    for t, value in steps:
        replicas = hpa.reconcile(t, replicas, replicas, [pods_metric(value, target)])
        seen.append(replicas)
    return seen


# "When the metrics indicate that the target should be scaled down the algorithm looks into
# previously computed desired states, and uses the highest value from the specified
# interval." (stabilizationWindowSeconds: 300 by default, 60 in the example)
def test_scale_down_waits_for_the_highest_recommendation_in_the_window():
    hpa = HorizontalController(1, 10, Behavior())
    # a burst wants 8, then the load drops to what 2 replicas would hold
    seen = run(hpa, [(0, 16.0)] + [(15.0 * i, 2.0) for i in range(1, 25)], target=8.0, start=4)
    assert seen[0] == 8
    # the recommendation of 8 counts while it is younger than 300 s (strictly after the cutoff)
    assert all(r == 8 for r in seen[1:20])  # t = 15 .. 285
    assert seen[20] == 2  # t = 300: made exactly 300 s ago, out of the window


def test_a_60_second_window_scales_down_a_minute_after_the_last_high_recommendation():
    hpa = HorizontalController(1, 10, Behavior(scale_down=rules(60, DEFAULT_SCALE_DOWN)))
    seen = run(hpa, [(0, 16.0), (15, 2.0), (30, 2.0), (45, 2.0), (60, 2.0), (75, 2.0)], 8.0, 4)
    assert seen == [8, 8, 8, 8, 2, 2]  # at t = 60 the t = 0 recommendation is 60 s old: out


# "For scaling up there is no stabilization window ... There are 2 policies where 4 pods or a
# 100% of the currently running replicas will be added every 15 seconds till the HPA reaches
# its steady state."
def test_default_scale_up_adds_the_larger_of_4_pods_and_100_percent_per_15_seconds():
    hpa = HorizontalController(1, 100, Behavior())
    replicas, seen = 1, []
    for t in (0, 15, 30, 45, 60):  # the metric asks for 40 throughout
        replicas = hpa.reconcile(t, replicas, replicas, [lambda s, st: 40])
        seen.append(replicas)
    assert seen == [5, 10, 20, 40, 40]  # 1+4, then doubling


def test_within_one_period_the_rate_counts_what_was_already_added():
    hpa = HorizontalController(1, 100, Behavior())
    assert hpa.reconcile(0, 1, 1, [lambda s, st: 40]) == 5
    assert hpa.reconcile(5, 5, 5, [lambda s, st: 40]) == 5  # the period began at 1: limit 1+4


# "For instance if there are 80 replicas and the target has to be scaled down to 10 replicas
# then during the first step 8 replicas will be reduced. In the next iteration when the
# number of replicas is 72, 10% of the pods is 7.2 but the number is rounded up to 8. ...
# When the number of replicas falls below 40 the first policy (Pods) is applied and 4
# replicas will be reduced at a time."
def test_scale_down_policies_pick_the_largest_change_per_period():
    behavior = Behavior(scale_down=rules(0, DEFAULT_SCALE_DOWN, [ScalingPolicy(PODS, 4, 60), ScalingPolicy(PERCENT, 10, 60)]))
    hpa = HorizontalController(1, 100, behavior)
    replicas, seen = 80, []
    for step in range(12):
        replicas = hpa.reconcile(61.0 * step, replicas, replicas, [lambda s, st: 10])
        seen.append(replicas)
    assert seen[:2] == [72, 64]  # 8 then 8 (72 * 0.9 = 64.8 -> 64)
    assert seen[2:6] == [57, 51, 45, 40]  # 10% while above 40
    assert seen[6:] == [36, 32, 28, 24, 20, 16]  # 4 pods at a time at 40 and below


# "To limit the rate at which pods are removed by the HPA to 10% per minute ... To ensure that
# no more than 5 Pods are removed per minute, you can add a second scale-down policy with a
# fixed size of 5, and set selectPolicy to minimum."
def test_select_policy_min_removes_at_most_5_pods_per_minute():
    behavior = Behavior(scale_down=rules(0, DEFAULT_SCALE_DOWN, [ScalingPolicy(PERCENT, 10, 60), ScalingPolicy(PODS, 5, 60)], SELECT_MIN))
    hpa = HorizontalController(1, 200, behavior)
    assert hpa.reconcile(0, 100, 100, [lambda s, st: 10]) == 95  # min change: 5 (10% would be 10)
    assert hpa.reconcile(30, 95, 95, [lambda s, st: 10]) == 95  # 5 already removed this minute
    assert hpa.reconcile(61, 95, 95, [lambda s, st: 10]) == 90
    assert hpa.reconcile(122, 40, 40, [lambda s, st: 10]) == 36  # 10% of 40 = 4 < 5


# "The selectPolicy value of Disabled turns off scaling the given direction."
def test_disabled_scale_down_never_removes_pods():
    behavior = Behavior(scale_down=rules(0, DEFAULT_SCALE_DOWN, select=SELECT_DISABLED))
    hpa = HorizontalController(1, 10, behavior)
    assert hpa.reconcile(0, 6, 6, [lambda s, st: 1]) == 6
    assert hpa.reconcile(600, 6, 6, [lambda s, st: 1]) == 6
    assert hpa.reconcile(615, 6, 6, [lambda s, st: 9]) == 9  # scaling up still works


def test_min_and_max_replicas_bound_the_count():
    hpa = HorizontalController(2, 5, Behavior(scale_down=rules(0, DEFAULT_SCALE_DOWN)))
    assert hpa.reconcile(0, 3, 3, [lambda s, st: 50]) == 5
    assert hpa.reconcile(15, 5, 5, [lambda s, st: 0]) == 2
    assert hpa.reconcile(30, 9, 9, [lambda s, st: 9]) == 5  # above max: brought to max at once
    assert hpa.reconcile(45, 1, 1, [lambda s, st: 1]) == 2  # below min: brought to min


# "If the target's desired replica count is set to 0, and the HPA's minimum replica count is
# greater than 0, the HPA stops adjusting the target"
def test_a_target_scaled_to_zero_is_left_alone():
    hpa = HorizontalController(1, 5, Behavior())
    assert hpa.reconcile(0, 0, 0, [lambda s, st: 4]) == 0


def test_the_default_behavior_is_kubernetes_defaults():
    assert DEFAULT_SCALE_UP.stabilization_window_seconds == 0
    assert {(p.type, p.value, p.period_seconds) for p in DEFAULT_SCALE_UP.policies} == {(PERCENT, 100, 15), (PODS, 4, 15)}
    assert DEFAULT_SCALE_DOWN.stabilization_window_seconds == 300
    assert [(p.type, p.value, p.period_seconds) for p in DEFAULT_SCALE_DOWN.policies] == [(PERCENT, 100, 15)]
