"""Raw InferenceService spec → validated `InferenceServiceSpec`, or `SpecError`.

`parse_spec` applies the same defaults as the CRD's schema and re-checks every rule the
operator relies on (bounds, enums, patterns, unknown fields and the cross-field CEL
rules), so the builders downstream can trust what they get. All problems are reported
at once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .sources import read_model, read_secret_ref
from .spec import (
    Autoscaling,
    InferenceServiceSpec,
    MetricTarget,
    NetworkPolicy,
    PodOptions,
    Resources,
    RuntimeOptions,
    ScalingPolicy,
    ScalingRules,
    Scheduling,
)
from .validation import (
    DNS1035_LABEL,
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    LABEL_VALUE,
    Reader,
    SpecError,
    check_label_key,
)

__all__ = ["MANAGED_FLAGS", "RESERVED_ENV", "SpecError", "abbreviates", "parse_spec"]

GPU_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
IMAGE = re.compile(r"^[^\s]{1,512}$")

# flags the operator sets itself; extraArgs may not repeat them
MANAGED_FLAGS = (
    rc.FLAG_MODEL,
    rc.FLAG_SERVED_MODEL_NAME,
    rc.FLAG_HOST,
    rc.FLAG_PORT,
    rc.FLAG_DEVICE,
    rc.FLAG_API_KEY,
    rc.FLAG_TENSOR_PARALLEL_SIZE,
    rc.FLAG_PAGE_SIZE,
    rc.FLAG_MAX_RUNNING_REQUESTS,
    rc.FLAG_CHUNKED_PREFILL_SIZE,
    rc.FLAG_SCHEDULE_POLICY,
    rc.FLAG_DISABLE_OVERLAP_SCHEDULE,
    rc.FLAG_MEM_FRACTION_STATIC,
    rc.FLAG_ATTENTION_BACKEND,
    rc.FLAG_DTYPE,
    rc.FLAG_STARTUP_TIMEOUT,
    rc.FLAG_DRAIN_TIMEOUT,
)
# environment variables the operator sets itself (in the runtime or the download
# container); spec.env may not repeat them
RESERVED_ENV = (
    c.ENV_HF_TOKEN,
    c.ENV_HF_HOME,
    c.ENV_XDG_CACHE_HOME,
    rc.ENV_API_KEY,
    c.ENV_MODEL_REPO,
    c.ENV_MODEL_REVISION,
    c.ENV_MODEL_DIR,
    c.ENV_MODEL_FILES,
    c.ENV_MODEL_CACHE,
)
# pod labels the operator sets itself; spec.podMetadata.labels may not repeat them
RESERVED_POD_LABELS = (
    c.LABEL_NAME,
    c.LABEL_INSTANCE,
    c.LABEL_COMPONENT,
    c.LABEL_PART_OF,
    c.LABEL_MANAGED_BY,
    c.LABEL_POD_TEMPLATE_HASH,
)

SPEC_FIELDS = (
    "model",
    "image",
    "replicas",
    "resources",
    "runtime",
    "autoscaling",
    "scheduling",
    "env",
    "startupTimeoutSeconds",
    "terminationGracePeriodSeconds",
    "serviceAccountName",
    "imagePullSecrets",
    "podMetadata",
    "networkPolicy",
)
RUNTIME_FIELDS = (
    "tensorParallelSize",
    "pageSize",
    "maxRunningRequests",
    "chunkedPrefillSize",
    "schedulePolicy",
    "overlapSchedule",
    "memFractionStatic",
    "attentionBackend",
    "dtype",
    "apiKeySecretRef",
    "extraArgs",
)
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POLICY_TYPES = ("Pods", "Percent")
SELECT_POLICIES = ("Max", "Min", "Disabled")


def parse_spec(
    name: str, namespace: str, spec: Mapping[str, Any], *, default_image: str
) -> InferenceServiceSpec:
    """Validate `spec` of the InferenceService `namespace/name`; raise SpecError if invalid."""
    r = Reader()
    if not isinstance(spec, Mapping):
        raise SpecError(["spec: must be an object"])
    if len(name) > c.MAX_NAME_LENGTH or not DNS1035_LABEL.match(name):
        r.fail(
            "metadata.name",
            f"must be a DNS-1035 label (lower-case letters, digits, '-'; starting with a letter)"
            f" of at most {c.MAX_NAME_LENGTH} characters, got {name!r}",
        )
    r.known(spec, SPEC_FIELDS, "spec")
    model = read_model(r, spec)
    image = r.string(spec, "image", "spec.image", default=default_image, pattern=IMAGE)
    replicas = r.integer(
        spec,
        "replicas",
        "spec.replicas",
        default=c.DEFAULT_REPLICAS,
        minimum=0,
        maximum=c.MAX_REPLICAS,
    )
    resources = _resources(r, spec)
    runtime = _runtime(r, spec, resources)
    autoscaling = _autoscaling(r, spec)
    scheduling = _scheduling(r, spec)
    env = _env(r, spec)
    pod = _pod(r, spec)
    network_policy = _network_policy(r, spec)
    startup = r.integer(
        spec,
        "startupTimeoutSeconds",
        "spec.startupTimeoutSeconds",
        default=c.DEFAULT_STARTUP_TIMEOUT_SECONDS,
        minimum=60,
        maximum=14400,
    )
    grace = r.integer(
        spec,
        "terminationGracePeriodSeconds",
        "spec.terminationGracePeriodSeconds",
        default=c.DEFAULT_TERMINATION_GRACE_SECONDS,
        minimum=c.MIN_TERMINATION_GRACE_SECONDS,
        maximum=3600,
    )
    r.raise_if_invalid()
    assert model is not None and image is not None and replicas is not None
    assert startup is not None and grace is not None
    return InferenceServiceSpec(
        name=name,
        namespace=namespace,
        image=image,
        model=model,
        replicas=replicas,
        resources=resources,
        runtime=runtime,
        autoscaling=autoscaling,
        scheduling=scheduling,
        env=env,
        startup_timeout_seconds=startup,
        termination_grace_period_seconds=grace,
        pod=pod,
        network_policy=network_policy,
    )


def _resources(r: Reader, spec: Mapping[str, Any]) -> Resources:
    res = r.mapping(spec, "resources", "spec.resources")
    r.known(res, ("gpus", "gpuResource", "cpu", "memory", "shmSize"), "spec.resources")
    gpus = r.integer(res, "gpus", "spec.resources.gpus", default=0, minimum=0, maximum=c.MAX_GPUS)
    gpu_resource = r.string(
        res,
        "gpuResource",
        "spec.resources.gpuResource",
        default=c.DEFAULT_GPU_RESOURCE,
        pattern=GPU_RESOURCE,
        max_length=253,
    )
    return Resources(
        gpus=gpus or 0,
        gpu_resource=gpu_resource or c.DEFAULT_GPU_RESOURCE,
        cpu=r.quantity(res, "cpu", "spec.resources.cpu"),
        memory=r.quantity(res, "memory", "spec.resources.memory"),
        shm_size=r.quantity(res, "shmSize", "spec.resources.shmSize"),
    )


def _runtime(r: Reader, spec: Mapping[str, Any], resources: Resources) -> RuntimeOptions:
    rt = r.mapping(spec, "runtime", "spec.runtime")
    p = "spec.runtime"
    r.known(rt, RUNTIME_FIELDS, p)
    # one replica is one model instance: its GPUs are its tensor-parallel ranks
    tp = (
        r.integer(
            rt,
            "tensorParallelSize",
            f"{p}.tensorParallelSize",
            default=resources.gpus or c.DEFAULT_TENSOR_PARALLEL_SIZE,
            minimum=1,
            maximum=c.MAX_TENSOR_PARALLEL_SIZE,
        )
        or c.DEFAULT_TENSOR_PARALLEL_SIZE
    )
    if resources.gpus > 0 and resources.gpus != tp:
        r.fail(
            f"{p}.tensorParallelSize",
            f"{tp} must equal spec.resources.gpus ({resources.gpus}): each replica runs one"
            " model sharded over its GPUs",
        )
    if resources.shm_size and tp == 1:
        r.fail("spec.resources.shmSize", "is only used with tensorParallelSize > 1")
    backend = r.string(
        rt, "attentionBackend", f"{p}.attentionBackend", choices=rc.ATTENTION_BACKENDS
    )
    if backend == "flashinfer" and resources.gpus == 0:
        r.fail(f"{p}.attentionBackend", "flashinfer needs spec.resources.gpus > 0")
    extra = r.strings(rt, "extraArgs", f"{p}.extraArgs", max_items=c.MAX_EXTRA_ARGS, max_length=256)
    for index, arg in enumerate(extra):
        managed = abbreviates(arg)
        if managed is not None:
            flag = arg.split("=", 1)[0]
            what = managed if flag == managed else f"{flag} (read as {managed})"
            r.fail(f"{p}.extraArgs[{index}]", f"{what} is set by the operator from its own field")
    return RuntimeOptions(
        tensor_parallel_size=tp,
        page_size=r.integer(rt, "pageSize", f"{p}.pageSize", minimum=1, maximum=4096),
        max_running_requests=r.integer(
            rt, "maxRunningRequests", f"{p}.maxRunningRequests", minimum=1, maximum=65536
        ),
        chunked_prefill_size=r.integer(
            rt, "chunkedPrefillSize", f"{p}.chunkedPrefillSize", minimum=1, maximum=1048576
        ),
        schedule_policy=r.string(
            rt, "schedulePolicy", f"{p}.schedulePolicy", choices=rc.SCHEDULE_POLICIES
        ),
        overlap_schedule=r.boolean(rt, "overlapSchedule", f"{p}.overlapSchedule", default=True),
        mem_fraction_static=r.number(
            rt,
            "memFractionStatic",
            f"{p}.memFractionStatic",
            exclusive_minimum=0,
            exclusive_maximum=1,
        ),
        attention_backend=backend,
        dtype=r.string(rt, "dtype", f"{p}.dtype", choices=rc.DTYPES),
        api_key_secret=read_secret_ref(
            r, rt, "apiKeySecretRef", f"{p}.apiKeySecretRef", c.DEFAULT_API_KEY_KEY
        ),
        extra_args=tuple(extra),
    )


def abbreviates(arg: str) -> str | None:
    """The managed flag `arg` would set if argparse read it with abbreviations allowed
    (`--por=1` is `--port=1`; `--` alone ends the options), or None."""
    flag = arg.split("=", 1)[0]
    if not flag.startswith("--"):
        return None
    return next((managed for managed in MANAGED_FLAGS if managed.startswith(flag)), None)


def _autoscaling(r: Reader, spec: Mapping[str, Any]) -> Autoscaling:
    a = r.mapping(spec, "autoscaling", "spec.autoscaling")
    p = "spec.autoscaling"
    r.known(a, ("enabled", "minReplicas", "maxReplicas", "metrics", "behavior"), p)
    enabled = r.boolean(a, "enabled", f"{p}.enabled", default=False)
    low = r.integer(
        a,
        "minReplicas",
        f"{p}.minReplicas",
        default=c.DEFAULT_MIN_REPLICAS,
        minimum=1,
        maximum=c.MAX_REPLICAS,
    )
    high = r.integer(
        a,
        "maxReplicas",
        f"{p}.maxReplicas",
        default=c.DEFAULT_MAX_REPLICAS,
        minimum=1,
        maximum=c.MAX_REPLICAS,
    )
    low, high = low or c.DEFAULT_MIN_REPLICAS, high or c.DEFAULT_MAX_REPLICAS
    if low > high:
        r.fail(f"{p}.minReplicas", f"{low} is greater than maxReplicas ({high})")
    metrics = _metrics(r, a, p) if a.get("metrics") is not None else Autoscaling().metrics
    behavior = r.mapping(a, "behavior", f"{p}.behavior")
    r.known(behavior, ("scaleUp", "scaleDown"), f"{p}.behavior")
    up = _scaling_rules(
        r, behavior, "scaleUp", f"{p}.behavior.scaleUp", c.DEFAULT_SCALE_UP_WINDOW_SECONDS
    )
    down = _scaling_rules(
        r, behavior, "scaleDown", f"{p}.behavior.scaleDown", c.DEFAULT_SCALE_DOWN_WINDOW_SECONDS
    )
    return Autoscaling(enabled, low, high, metrics, up, down)


def _metrics(r: Reader, a: Mapping[str, Any], p: str) -> tuple[MetricTarget, ...]:
    items = r.objects(a, "metrics", f"{p}.metrics", max_items=len(c.METRIC_TYPES))
    if not items and isinstance(a.get("metrics"), list):
        r.fail(f"{p}.metrics", "must name at least one metric")
    seen: set[str] = set()
    metrics: list[MetricTarget] = []
    for index, item in enumerate(items):
        path = f"{p}.metrics[{index}]"
        r.known(item, ("type", "target"), path)
        kind = r.string(item, "type", f"{path}.type", required=True, choices=c.METRIC_TYPES)
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
    r: Reader, behavior: Mapping[str, Any], key: str, p: str, window: int
) -> ScalingRules:
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
            rules,
            "stabilizationWindowSeconds",
            f"{p}.stabilizationWindowSeconds",
            default=window,
            minimum=0,
            maximum=3600,
        )
        or 0,
        select_policy=r.string(rules, "selectPolicy", f"{p}.selectPolicy", choices=SELECT_POLICIES),
        policies=tuple(policies),
    )


def _scheduling(r: Reader, spec: Mapping[str, Any]) -> Scheduling:
    s = r.mapping(spec, "scheduling", "spec.scheduling")
    p = "spec.scheduling"
    r.known(
        s,
        (
            "nodeSelector",
            "tolerations",
            "affinity",
            "priorityClassName",
            "runtimeClassName",
            "topologySpreadConstraints",
        ),
        p,
    )
    node_selector = r.string_map(s, "nodeSelector", f"{p}.nodeSelector")
    for key, value in node_selector.items():
        if len(value) > 63 or not LABEL_VALUE.match(value):
            r.fail(f"{p}.nodeSelector.{key}", f"{value!r} is not a valid label value")
    tolerations = r.objects(s, "tolerations", f"{p}.tolerations", max_items=64)
    for index, tol in enumerate(tolerations):
        path = f"{p}.tolerations[{index}]"
        op = r.string(tol, "operator", f"{path}.operator", choices=TOLERATION_OPERATORS)
        r.string(tol, "effect", f"{path}.effect", choices=TOLERATION_EFFECTS)
        r.string(tol, "key", f"{path}.key", max_length=316)
        r.integer(tol, "tolerationSeconds", f"{path}.tolerationSeconds")
        if op == "Exists" and tol.get("value"):
            r.fail(f"{path}.value", "must be empty when operator is Exists")
        r.known(tol, ("key", "operator", "value", "effect", "tolerationSeconds"), path)
    affinity = r.mapping(s, "affinity", f"{p}.affinity") if s.get("affinity") is not None else None
    spread: tuple[Mapping[str, Any], ...] | None = None
    if s.get("topologySpreadConstraints") is not None:
        spread = tuple(
            r.objects(s, "topologySpreadConstraints", f"{p}.topologySpreadConstraints", max_items=8)
        )
    return Scheduling(
        node_selector=node_selector,
        tolerations=tuple(tolerations),
        affinity=affinity,
        priority_class_name=r.string(
            s,
            "priorityClassName",
            f"{p}.priorityClassName",
            pattern=DNS1123_SUBDOMAIN,
            max_length=253,
        ),
        runtime_class_name=r.string(
            s,
            "runtimeClassName",
            f"{p}.runtimeClassName",
            pattern=DNS1123_SUBDOMAIN,
            max_length=253,
        ),
        topology_spread_constraints=spread,
    )


def _env(r: Reader, spec: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    items = r.objects(spec, "env", "spec.env", max_items=128)
    names: set[str] = set()
    for index, item in enumerate(items):
        path = f"spec.env[{index}]"
        name = r.string(
            item, "name", f"{path}.name", required=True, pattern=ENV_NAME, max_length=256
        )
        if name in RESERVED_ENV:
            r.fail(f"{path}.name", f"{name} is set by the operator")
        if name in names:
            r.fail(f"{path}.name", f"{name} is listed twice")
        names.add(name or "")
        if "value" in item and "valueFrom" in item:
            r.fail(path, "set value or valueFrom, not both")
        if "value" in item and not isinstance(item["value"], str):
            r.fail(f"{path}.value", "must be a string")
        if "valueFrom" in item:
            r.mapping(item, "valueFrom", f"{path}.valueFrom")
        r.known(item, ("name", "value", "valueFrom"), path)
    return tuple(items)


def _pod(r: Reader, spec: Mapping[str, Any]) -> PodOptions:
    account = r.string(
        spec, "serviceAccountName", "spec.serviceAccountName", pattern=DNS1123_SUBDOMAIN,
        max_length=253,
    )  # fmt: skip
    secrets: list[str] = []
    for index, ref in enumerate(
        r.objects(spec, "imagePullSecrets", "spec.imagePullSecrets", max_items=16)
    ):
        path = f"spec.imagePullSecrets[{index}]"
        r.known(ref, ("name",), path)
        name = r.string(
            ref, "name", f"{path}.name", required=True, pattern=DNS1123_SUBDOMAIN, max_length=253
        )
        if name:
            secrets.append(name)
    meta = r.mapping(spec, "podMetadata", "spec.podMetadata")
    r.known(meta, ("labels", "annotations"), "spec.podMetadata")
    labels = r.string_map(meta, "labels", "spec.podMetadata.labels")
    for key, value in labels.items():
        path = f"spec.podMetadata.labels.{key}"
        check_label_key(r, key, path)
        if key in RESERVED_POD_LABELS:
            r.fail(path, f"{key} is set by the operator")
        if len(value) > 63 or not LABEL_VALUE.match(value):
            r.fail(path, f"{value!r} is not a valid label value")
    annotations = r.string_map(meta, "annotations", "spec.podMetadata.annotations")
    for key in annotations:
        check_label_key(r, key, f"spec.podMetadata.annotations.{key}")
    return PodOptions(
        service_account_name=account,
        image_pull_secrets=tuple(secrets),
        labels=labels,
        annotations=annotations,
    )


def _network_policy(r: Reader, spec: Mapping[str, Any]) -> NetworkPolicy:
    p = "spec.networkPolicy"
    policy = r.mapping(spec, "networkPolicy", p)
    r.known(policy, ("enabled", "allowedNamespaces", "monitoringNamespace"), p)
    namespaces = r.strings(policy, "allowedNamespaces", f"{p}.allowedNamespaces", max_items=64)
    for index, name in enumerate(namespaces):
        if len(name) > 63 or not DNS1123_LABEL.match(name):
            r.fail(f"{p}.allowedNamespaces[{index}]", f"{name!r} is not a namespace name")
    monitoring = r.string(
        policy, "monitoringNamespace", f"{p}.monitoringNamespace",
        default=c.DEFAULT_MONITORING_NAMESPACE, pattern=DNS1123_LABEL, max_length=63,
    )  # fmt: skip
    return NetworkPolicy(
        enabled=r.boolean(policy, "enabled", f"{p}.enabled", default=False),
        allowed_namespaces=tuple(namespaces),
        monitoring_namespace=monitoring,
    )
