"""What a valid InferenceService spec is: frozen dataclasses with the CRD's defaults.

`parsing.parse_spec` builds them from the raw object and is the only way in; builders
and the status take them as given.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class ModelSource:
    """Where the weights come from: `bundled://NAME`, `hf://ORG/NAME` or `pvc://CLAIM/PATH`."""

    uri: str
    scheme: str
    repo: str | None = None  # hf: "org/name"
    claim: str | None = None  # pvc: claim name
    path: str = ""  # pvc: path inside the claim, "" for its root; bundled: the model's name

    @property
    def default_served_name(self) -> str:
        if self.scheme == "bundled":
            return rc.BUNDLED_MODELS.get(self.path, rc.BUNDLED_SERVED_NAME)
        if self.scheme == "hf":
            assert self.repo is not None
            return self.repo
        last = self.path.rsplit("/", 1)[-1] if self.path else (self.claim or "model")
        return last.removesuffix(".gguf")


@dataclass(frozen=True)
class LoraAdapterSpec:
    """One LoRA adapter: its name (what clients send as `model`) and where it comes from
    (`hf://ORG/NAME` at `revision`, or `pvc://CLAIM/PATH`)."""

    name: str
    source: ModelSource
    revision: str | None = None


@dataclass(frozen=True)
class LoraSpec:
    """`spec.model.lora`: adapters served with the model (`sluice serve --enable-lora`)."""

    adapters: tuple[LoraAdapterSpec, ...] = ()
    max_adapters: int | None = None  # --max-loras (adapters in one batch)
    max_rank: int | None = None  # --max-lora-rank


@dataclass(frozen=True)
class ModelSpec:
    source: ModelSource
    served_name: str
    revision: str | None = None
    token_secret: SecretKeyRef | None = None
    storage_size: str | None = None
    files: tuple[str, ...] = ()  # hf: allow patterns of the download (empty: every file)
    cache_claim: str | None = None  # hf: a ReadWriteMany claim shared as the Hub cache
    lora: LoraSpec | None = None

    @property
    def single_file(self) -> str | None:
        """The one file `files` names literally (a GGUF the runtime loads as a file)."""
        if len(self.files) == 1 and not any(ch in self.files[0] for ch in "*?["):
            return self.files[0]
        return None


_SUFFIXES = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
             "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
             "Ei": 2**60}  # fmt: skip


def quantity_value(text: str) -> float | None:
    """The number a Kubernetes quantity stands for ("500m" → 0.5, "2" → 2.0, "1Ki" →
    1024.0); None if it is not one."""
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    suffix = text[len(number) :]
    if suffix not in _SUFFIXES:
        return None
    try:
        return float(number) * _SUFFIXES[suffix]
    except ValueError:
        return None


@dataclass(frozen=True)
class Resources:
    gpus: int = 0
    gpu_resource: str = c.DEFAULT_GPU_RESOURCE
    cpu: str | None = None
    memory: str | None = None
    shm_size: str | None = None  # memory-backed /dev/shm for tensor parallelism

    @property
    def device(self) -> str:
        return "cuda" if self.gpus > 0 else "cpu"

    @property
    def cpu_threads(self) -> int | None:
        """Threads the CPU request pays for (rounded up), None without a request: torch's
        default is one thread per core of the node, whatever the pod may use."""
        cores = quantity_value(self.cpu) if self.cpu else None
        return None if cores is None else max(1, math.ceil(cores))


@dataclass(frozen=True)
class RuntimeOptions:
    tensor_parallel_size: int = c.DEFAULT_TENSOR_PARALLEL_SIZE
    page_size: int | None = None
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    schedule_policy: str | None = None
    overlap_schedule: bool = True
    mem_fraction_static: float | None = None
    attention_backend: str | None = None
    dtype: str | None = None
    api_key_secret: SecretKeyRef | None = None
    extra_args: tuple[str, ...] = ()


# autoscaling metric type -> the per-pod custom metric the HPA reads (prometheus-adapter)
HPA_METRICS = {
    c.METRIC_QUEUE_DEPTH: rc.HPA_METRIC_QUEUE_DEPTH,
    c.METRIC_KV_TOKEN_USAGE: rc.HPA_METRIC_KV_TOKEN_USAGE,
    c.METRIC_QUEUE_PROMPT_TOKENS: rc.METRIC_QUEUE_PROMPT_TOKENS,
    c.METRIC_RUNNING_REQUESTS: rc.METRIC_RUNNING_REQUESTS,
    c.METRIC_DISAGG_WAITING_REQUESTS: rc.METRIC_DISAGG_WAITING_REQUESTS,
}


@dataclass(frozen=True)
class MetricTarget:
    type: str  # a key of HPA_METRICS: queueDepth, kvTokenUsage, or a P/D pool's own
    target: float  # average per pod

    @property
    def metric_name(self) -> str:
        return HPA_METRICS[self.type]


@dataclass(frozen=True)
class ScalingPolicy:
    type: str
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_seconds: int
    select_policy: str | None = None
    policies: tuple[ScalingPolicy, ...] = ()


@dataclass(frozen=True)
class Autoscaling:
    enabled: bool = False
    min_replicas: int = c.DEFAULT_MIN_REPLICAS
    max_replicas: int = c.DEFAULT_MAX_REPLICAS
    metrics: tuple[MetricTarget, ...] = tuple(MetricTarget(t, v) for t, v in c.DEFAULT_METRICS)
    scale_up: ScalingRules = ScalingRules(c.DEFAULT_SCALE_UP_WINDOW_SECONDS)
    scale_down: ScalingRules = ScalingRules(c.DEFAULT_SCALE_DOWN_WINDOW_SECONDS)
    policy: str = c.DEFAULT_AUTOSCALING_POLICY  # hpa: `metrics`; saturation: the recording rule


@dataclass(frozen=True)
class Scheduling:
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    # None: the operator's default (spread over nodes); () turns spreading off
    topology_spread_constraints: tuple[Mapping[str, Any], ...] | None = None


@dataclass(frozen=True)
class NetworkPolicy:
    """Ingress to the pods' HTTP port: their own namespace, the listed namespaces (API
    clients) and the monitoring namespace (Prometheus). NetworkPolicies are L4: a
    namespace that may scrape /metrics may also call the API (use an API key)."""

    enabled: bool = False
    allowed_namespaces: tuple[str, ...] = ()
    monitoring_namespace: str | None = c.DEFAULT_MONITORING_NAMESPACE


@dataclass(frozen=True)
class Rollout:
    """The Deployment's RollingUpdate: pods (int) or a percentage ("25%") of the replicas.
    The default never takes a serving pod down first but needs room for one more pod;
    `max_surge=0, max_unavailable=1` fits a full GPU pool (one pod replaced in place at a
    time). Never both 0."""

    max_surge: int | str = c.DEFAULT_MAX_SURGE
    max_unavailable: int | str = c.DEFAULT_MAX_UNAVAILABLE


@dataclass(frozen=True)
class PodOptions:
    """Pod-level settings copied to the runtime pods."""

    service_account_name: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RouterOptions:
    """`sluice router` in front of the runtime pods (spec.router): the model Service sends
    to it, and it picks a runtime pod per request by `policy` (prefix-cache aware by
    default), finding them from the EndpointSlices of the `<name>-workers` Service. `image`:
    the router's own (no torch), `spec.router.image` or the operator's router image."""

    enabled: bool = False
    image: str = c.DEFAULT_ROUTER_IMAGE
    replicas: int = c.DEFAULT_ROUTER_REPLICAS
    policy: str = c.DEFAULT_ROUTER_POLICY
    cpu: str | None = None
    memory: str | None = None


@dataclass(frozen=True)
class InferencePoolOptions:
    """An InferencePool (Gateway API Inference Extension) of the runtime pods, rendered
    where its CRD is installed; the runtime then also exposes the metrics its endpoint
    picker reads (`--metrics-compat vllm`)."""

    enabled: bool = False
    endpoint_picker: str | None = None  # Service name; None: "<name>-epp"
    endpoint_picker_port: int = c.DEFAULT_EPP_PORT
    failure_mode: str = c.DEFAULT_EPP_FAILURE_MODE


@dataclass(frozen=True)
class PoolSpec:
    """One pool of a disaggregated service (`spec.disaggregation.prefill` / `.decode`):
    `sluice serve --disaggregation-mode ROLE` pods. `resources` and `autoscaling` are the
    service's own where the pool sets none (field by field; its metrics are the pool's)."""

    role: str  # prefill | decode
    replicas: int = c.DEFAULT_POOL_REPLICAS
    resources: Resources = Resources()
    autoscaling: Autoscaling = Autoscaling()


@dataclass(frozen=True)
class Disaggregation:
    """Prefill/decode disaggregation (spec.disaggregation): a prefill pool computes prompts
    and serves their KV on `bootstrap_port` to a decode pool, which generates; `sluice
    router --pd-disaggregation` (always on then) pairs one pod of each per request."""

    enabled: bool = False
    prefill: PoolSpec = PoolSpec(c.ROLE_PREFILL)
    decode: PoolSpec = PoolSpec(c.ROLE_DECODE)
    bootstrap_port: int = rc.DISAGG_DEFAULT_BOOTSTRAP_PORT


@dataclass(frozen=True)
class InferenceServiceSpec:
    name: str
    namespace: str
    image: str
    model: ModelSpec
    replicas: int = c.DEFAULT_REPLICAS
    rollout: Rollout = Rollout()
    resources: Resources = Resources()
    runtime: RuntimeOptions = RuntimeOptions()
    autoscaling: Autoscaling = Autoscaling()
    scheduling: Scheduling = Scheduling()
    env: tuple[Mapping[str, Any], ...] = ()
    startup_timeout_seconds: int = c.DEFAULT_STARTUP_TIMEOUT_SECONDS
    termination_grace_period_seconds: int = c.DEFAULT_TERMINATION_GRACE_SECONDS
    pod: PodOptions = PodOptions()
    network_policy: NetworkPolicy = NetworkPolicy()
    router: RouterOptions = RouterOptions()
    inference_pool: InferencePoolOptions = InferencePoolOptions()
    disaggregation: Disaggregation = Disaggregation()
    # set only in a pool's view of the spec (`for_pool`): which P/D pool it renders
    role: str | None = None

    @property
    def drain_timeout_seconds(self) -> int:
        """What SIGTERM leaves the runtime to finish running requests: the grace period
        minus the preStop sleep (spent before SIGTERM) minus time to exit cleanly."""
        return (
            self.termination_grace_period_seconds
            - c.PRESTOP_SLEEP_SECONDS
            - c.DRAIN_EXIT_MARGIN_SECONDS
        )

    @property
    def router_name(self) -> str:
        """The router's Deployment, ServiceAccount, Role and RoleBinding."""
        return self.name + c.ROUTER_SUFFIX

    @property
    def workers_service_name(self) -> str:
        return self.name + c.WORKERS_SUFFIX

    @property
    def endpoint_picker_name(self) -> str:
        return self.inference_pool.endpoint_picker or self.name + c.EPP_SUFFIX

    @property
    def runtime_name(self) -> str:
        """The runtime pods' Deployment (and PodDisruptionBudget, HPA): `<name>`, or in a
        pool's view `<name>-prefill` / `<name>-decode` (its Service too)."""
        return self.name if self.role is None else f"{self.name}-{self.role}"

    def for_pool(self, pool: PoolSpec) -> InferenceServiceSpec:
        """The spec as one P/D pool's children see it: the pool's replicas, resources and
        autoscaling in place of the service's, and its role."""
        return dataclasses.replace(
            self,
            replicas=pool.replicas,
            resources=pool.resources,
            autoscaling=pool.autoscaling,
            role=pool.role,
        )

    @property
    def runtime_views(self) -> tuple[InferenceServiceSpec, ...]:
        """One view per Deployment of runtime pods: the service itself, or with
        disaggregation its prefill pool's and its decode pool's."""
        if not self.disaggregation.enabled:
            return (self,)
        return tuple(
            self.for_pool(p) for p in (self.disaggregation.prefill, self.disaggregation.decode)
        )

    @property
    def autoscaled_start_replicas(self) -> int:
        """Replicas of a Deployment created under autoscaling, before the HPA acts."""
        scaling = self.autoscaling
        return min(max(self.replicas, scaling.min_replicas), scaling.max_replicas)
