"""Reading compute and scaling: `resources` and `autoscaling`, of the service and of each
P/D pool (spec.disaggregation.prefill / .decode). Part of `parse_spec`.

Both readers take the values a field falls back to when it is absent (`defaults`): the
CRD's defaults for the service's own fields, the service's values for a pool's, so a pool
sets only what differs (a pool's `autoscaling.metrics` falls back to the pool's own
default, its metric types being its own).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from . import constants as c
from .spec import Autoscaling, MetricTarget, Resources, ScalingPolicy, ScalingRules
from .validation import Reader

GPU_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
RESOURCE_FIELDS = ("gpus", "gpuResource", "cpu", "memory", "shmSize")
AUTOSCALING_FIELDS = ("enabled", "policy", "minReplicas", "maxReplicas", "metrics", "behavior")
POLICY_TYPES = ("Pods", "Percent")
SELECT_POLICIES = ("Max", "Min", "Disabled")
# what the service's own fields fall back to: the CRD's defaults
DEFAULT_RESOURCES = Resources()
DEFAULT_AUTOSCALING = Autoscaling()


def read_resources(
    r: Reader,
    parent: Mapping[str, Any],
    p: str,
    *,
    defaults: Resources = DEFAULT_RESOURCES,
    fields: Sequence[str] = RESOURCE_FIELDS,
) -> Resources:
    """`parent.resources` (at path `p`); `fields`: those this place of the spec has."""
    res = r.mapping(parent, "resources", p)
    r.known(res, fields, p)
    gpus = r.integer(res, "gpus", f"{p}.gpus", default=defaults.gpus, minimum=0, maximum=c.MAX_GPUS)
    gpu_resource = r.string(
        res, "gpuResource", f"{p}.gpuResource", default=defaults.gpu_resource,
        pattern=GPU_RESOURCE, max_length=253,
    )  # fmt: skip
    return Resources(
        gpus=gpus or 0,
        gpu_resource=gpu_resource or c.DEFAULT_GPU_RESOURCE,
        cpu=r.quantity(res, "cpu", f"{p}.cpu") or defaults.cpu,
        memory=r.quantity(res, "memory", f"{p}.memory") or defaults.memory,
        shm_size=r.quantity(res, "shmSize", f"{p}.shmSize") or defaults.shm_size,
    )


def read_autoscaling(
    r: Reader,
    parent: Mapping[str, Any],
    p: str,
    *,
    defaults: Autoscaling = DEFAULT_AUTOSCALING,
    metric_types: Sequence[str] = c.METRIC_TYPES,
    policies: Sequence[str] = c.AUTOSCALING_POLICIES,
) -> Autoscaling:
    """`parent.autoscaling` (at path `p`), whose `metrics` may name `metric_types` and
    whose `policy` may be one of `policies`."""
    a = r.mapping(parent, "autoscaling", p)
    r.known(a, AUTOSCALING_FIELDS, p)
    enabled = r.boolean(a, "enabled", f"{p}.enabled", default=defaults.enabled)
    policy = (
        r.string(a, "policy", f"{p}.policy", default=defaults.policy, choices=policies)
        or defaults.policy
    )
    low = r.integer(
        a, "minReplicas", f"{p}.minReplicas", default=defaults.min_replicas,
        minimum=1, maximum=c.MAX_REPLICAS,
    ) or defaults.min_replicas  # fmt: skip
    high = r.integer(
        a, "maxReplicas", f"{p}.maxReplicas", default=defaults.max_replicas,
        minimum=1, maximum=c.MAX_REPLICAS,
    ) or defaults.max_replicas  # fmt: skip
    if low > high:
        r.fail(f"{p}.minReplicas", f"{low} is greater than maxReplicas ({high})")
    metrics = _metrics(r, a, p, metric_types) if a.get("metrics") is not None else defaults.metrics
    behavior = r.mapping(a, "behavior", f"{p}.behavior")
    r.known(behavior, ("scaleUp", "scaleDown"), f"{p}.behavior")
    up = _scaling_rules(
        r, behavior, "scaleUp", f"{p}.behavior.scaleUp",
        c.DEFAULT_SCALE_UP_WINDOW_SECONDS, defaults.scale_up,
    )  # fmt: skip
    down = _scaling_rules(
        r, behavior, "scaleDown", f"{p}.behavior.scaleDown",
        c.DEFAULT_SCALE_DOWN_WINDOW_SECONDS, defaults.scale_down,
    )  # fmt: skip
    return Autoscaling(enabled, low, high, metrics, up, down, policy)


def _metrics(
    r: Reader, a: Mapping[str, Any], p: str, metric_types: Sequence[str]
) -> tuple[MetricTarget, ...]:
    items = r.objects(a, "metrics", f"{p}.metrics", max_items=len(metric_types))
    if not items and isinstance(a.get("metrics"), list):
        r.fail(f"{p}.metrics", "must name at least one metric")
    seen: set[str] = set()
    metrics: list[MetricTarget] = []
    for index, item in enumerate(items):
        path = f"{p}.metrics[{index}]"
        r.known(item, ("type", "target"), path)
        kind = r.string(item, "type", f"{path}.type", required=True, choices=metric_types)
        maximum = 1.0 if kind == c.METRIC_KV_TOKEN_USAGE else 1e6
        target = r.number(item, "target", f"{path}.target", exclusive_minimum=0, maximum=maximum)
        if target is None:
            r.fail(f"{path}.target", "is required")
        if kind in seen:
            r.fail(f"{path}.type", f"{kind} is listed twice")
        if kind and target is not None:
            seen.add(kind)
            metrics.append(MetricTarget(kind, target))
    return tuple(metrics)


def _scaling_rules(
    r: Reader,
    behavior: Mapping[str, Any],
    key: str,
    p: str,
    window: int,
    absent: ScalingRules,
) -> ScalingRules:
    """`behavior[key]`; `absent` when it is not given, `window` when it gives none."""
    if behavior.get(key) is None:
        return absent
    rules = r.mapping(behavior, key, p)
    r.known(rules, ("stabilizationWindowSeconds", "selectPolicy", "policies"), p)
    policies: list[ScalingPolicy] = []
    for index, item in enumerate(r.objects(rules, "policies", f"{p}.policies", max_items=10)):
        path = f"{p}.policies[{index}]"
        r.known(item, ("type", "value", "periodSeconds"), path)
        kind = r.string(item, "type", f"{path}.type", required=True, choices=POLICY_TYPES)
        value = r.integer(item, "value", f"{path}.value", minimum=1)
        period = r.integer(item, "periodSeconds", f"{path}.periodSeconds", minimum=1, maximum=1800)
        if value is None or period is None:
            r.fail(path, "value and periodSeconds are required")
        elif kind:
            policies.append(ScalingPolicy(kind, value, period))
    return ScalingRules(
        stabilization_window_seconds=r.integer(
            rules, "stabilizationWindowSeconds", f"{p}.stabilizationWindowSeconds",
            default=window, minimum=0, maximum=3600,
        ) or 0,
        select_policy=r.string(rules, "selectPolicy", f"{p}.selectPolicy", choices=SELECT_POLICIES),
        policies=tuple(policies),
    )  # fmt: skip
