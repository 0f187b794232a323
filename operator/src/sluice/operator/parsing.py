"""Raw InferenceService spec → validated `InferenceServiceSpec`, or `SpecError`.

`parse_spec` applies the same defaults as the CRD's schema and re-checks every rule the
operator relies on (bounds, enums, patterns, unknown fields and the cross-field CEL
rules), so the builders downstream can trust what they get. All problems are reported
at once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .compute_fields import read_autoscaling, read_resources
from .disaggregation_fields import read_disaggregation
from .pod_fields import (
    RESERVED_ENV,
    read_env,
    read_network_policy,
    read_pod_options,
    read_scheduling,
)
from .routing_fields import check_metrics_compat, read_inference_pool, read_router
from .sources import read_model, read_secret_ref
from .spec import InferenceServiceSpec, Resources, Rollout, RuntimeOptions
from .validation import (
    DNS1035_LABEL,
    IMAGE,
    Reader,
    SpecError,
)

__all__ = ["MANAGED_FLAGS", "RESERVED_ENV", "SpecError", "abbreviates", "parse_spec"]

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
    rc.FLAG_DISAGGREGATION_MODE,
    rc.FLAG_DISAGGREGATION_BOOTSTRAP_PORT,
)
SPEC_FIELDS = (
    "model",
    "image",
    "replicas",
    "rollout",
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
    "router",
    "inferencePool",
    "disaggregation",
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


def parse_spec(
    name: str,
    namespace: str,
    spec: Mapping[str, Any],
    *,
    default_image: str,
    router_image: str = c.DEFAULT_ROUTER_IMAGE,
) -> InferenceServiceSpec:
    """Validate `spec` of the InferenceService `namespace/name`; raise SpecError if invalid.
    `default_image` / `router_image`: the images without `spec.image` / `spec.router.image`."""
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
    rollout = _rollout(r, spec)
    resources = read_resources(r, spec, "spec.resources")
    runtime = _runtime(r, spec, resources)
    autoscaling = read_autoscaling(r, spec, "spec.autoscaling")
    scheduling = read_scheduling(r, spec)
    env = read_env(r, spec)
    pod = read_pod_options(r, spec)
    network_policy = read_network_policy(r, spec)
    router = read_router(r, spec, name, router_image)
    inference_pool = read_inference_pool(r, spec)
    check_metrics_compat(r, runtime, inference_pool)
    disaggregation = read_disaggregation(
        r, spec, name, resources=resources, autoscaling=autoscaling, runtime=runtime,
        inference_pool=inference_pool,
    )  # fmt: skip
    if disaggregation.enabled:  # the router pairs the pools' pods: it is part of P/D
        router = dataclasses.replace(router, enabled=True)
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
        rollout=rollout,
        resources=resources,
        runtime=runtime,
        autoscaling=autoscaling,
        scheduling=scheduling,
        env=env,
        startup_timeout_seconds=startup,
        termination_grace_period_seconds=grace,
        pod=pod,
        network_policy=network_policy,
        router=router,
        inference_pool=inference_pool,
        disaggregation=disaggregation,
    )


PERCENT = re.compile(r"^(100|[1-9]?[0-9])%$")


def _rollout(r: Reader, spec: Mapping[str, Any]) -> Rollout:
    p = "spec.rollout"
    rollout = r.mapping(spec, "rollout", p)
    r.known(rollout, ("maxSurge", "maxUnavailable"), p)
    values: dict[str, int | str] = {}
    for key, default in (
        ("maxSurge", c.DEFAULT_MAX_SURGE),
        ("maxUnavailable", c.DEFAULT_MAX_UNAVAILABLE),
    ):
        value = rollout.get(key, default)
        if isinstance(value, bool) or not (
            (isinstance(value, int) and value >= 0)
            or (isinstance(value, str) and PERCENT.match(value))
        ):
            r.fail(
                f"{p}.{key}",
                f'must be a number of pods (0 or more) or a percentage such as "25%", got {value!r}',
            )
            value = default
        values[key] = value
    if all(str(v) in ("0", "0%") for v in values.values()):
        r.fail(
            p, "maxSurge and maxUnavailable must not both be 0 (the rollout could never progress)"
        )
    return Rollout(max_surge=values["maxSurge"], max_unavailable=values["maxUnavailable"])


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
