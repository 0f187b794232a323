"""The autoscaling policies `sluice plan` compares, each as the objects a cluster would run:

- `hpa`: the operator's HPA on its Pods metrics (queueDepth = `sluice_queue_requests`,
  kvTokenUsage = `sluice_kv_token_usage`, AverageValue targets), read through
  prometheus-adapter from Prometheus' latest scrape;
- `saturation`: the operator's saturation policy, the recording rule's desired count
  (`saturation.py`) read by the HPA as an External metric, AverageValue target 1;
- `cpu`: a stock CPU-utilisation HPA (metrics-server), for comparison;
- `static`: a fixed replica count (no autoscaler), the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.sim.plan.hpa import Behavior
from sluice.runtime.sim.plan.saturation import SaturationConfig

METRIC_TYPES = ("queueDepth", "kvTokenUsage")
KINDS = ("hpa", "saturation", "cpu", "static")


@dataclass(frozen=True)
class PolicySpec:
    name: str
    kind: str
    min_replicas: int = 1
    max_replicas: int = 4
    metrics: tuple[tuple[str, float], ...] = ()  # hpa: (type, target)
    cpu_target_percent: int = 80
    saturation: SaturationConfig = field(default_factory=SaturationConfig)
    behavior: Behavior = field(default_factory=Behavior)
    replicas: int = 1  # static

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"policy {self.name}: kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "hpa" and not self.metrics:
            raise ValueError(f"policy {self.name}: an hpa policy needs at least one metric")
        for kind, target in self.metrics:
            if kind not in METRIC_TYPES:
                raise ValueError(f"policy {self.name}: metric {kind!r} is not one of {', '.join(METRIC_TYPES)}")
            if not target > 0 or (kind == "kvTokenUsage" and target > 1):
                raise ValueError(f"policy {self.name}: bad target {target} for {kind}")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"policy {self.name}: need 1 <= min replicas <= max replicas")


def parse_policy(text: str, min_replicas: int, max_replicas: int, behavior: Behavior) -> PolicySpec:
    """`hpa:queueDepth=8`, `hpa:queueDepth=4,kvTokenUsage=0.7`, `saturation`,
    `saturation:kv=0.8,queue=5,kvSpare=0.1,queueSpare=3`, `cpu:80`, `static:3`."""
    kind, _, rest = text.partition(":")
    kind = kind.strip()
    common = dict(min_replicas=min_replicas, max_replicas=max_replicas, behavior=behavior)
    try:
        if kind == "hpa":
            metrics = []
            for part in filter(None, rest.split(",")):
                name, _, value = part.partition("=")
                metrics.append((name.strip(), float(value)))
            return PolicySpec(text, "hpa", metrics=tuple(metrics), **common)  # type: ignore[arg-type]
        if kind == "saturation":
            keys = {"kv": "kv_threshold", "queue": "queue_threshold", "kvSpare": "kv_spare_trigger",
                    "queueSpare": "queue_spare_trigger"}  # fmt: skip
            values = {}
            for part in filter(None, rest.split(",")):
                name, _, value = part.partition("=")
                if name.strip() not in keys:
                    raise ValueError(f"unknown saturation setting {name!r} (choose from {', '.join(keys)})")
                values[keys[name.strip()]] = float(value)
            return PolicySpec(text, "saturation", saturation=SaturationConfig(**values), **common)  # type: ignore[arg-type]
        if kind == "cpu":
            return PolicySpec(text, "cpu", cpu_target_percent=int(rest or 80), **common)  # type: ignore[arg-type]
        if kind == "static":
            n = int(rest)
            return PolicySpec(text, "static", min_replicas=n, max_replicas=n, replicas=n, behavior=behavior)
    except ValueError as err:
        raise ValueError(f"--policy {text!r}: {err}") from None
    raise ValueError(f"--policy {text!r}: the kind must be one of {', '.join(KINDS)}")
