"""Reading `spec.disaggregation`: prefill/decode disaggregation. Part of `parse_spec`; the
CRD repeats every rule (CEL for the cross-field ones).

A pool's `resources` and `autoscaling` have the shape of the service's own and fall back
to them field by field; its autoscaling metrics are its own (the prefill pool scales on
the prompt tokens waiting, the decode pool on the requests it decodes). What P/D cannot do
yet is refused with the reason: tensor parallelism (the KV transfer sends one rank's
pages), the saturation policy (its recording rule sizes whole-request servers), an
InferencePool (its endpoint picker would send whole requests to P/D servers, which refuse
them), and the router turned off (it pairs a prefill and a decode pod per request).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .compute_fields import RESOURCE_FIELDS, read_autoscaling, read_resources
from .spec import (
    Autoscaling,
    Disaggregation,
    InferencePoolOptions,
    MetricTarget,
    PoolSpec,
    Resources,
    RuntimeOptions,
)
from .validation import Reader

DISAGGREGATION_FIELDS = ("enabled", "prefill", "decode", "bootstrapPort")
POOL_FIELDS = ("replicas", "resources", "autoscaling")
# tensor parallelism is not built for P/D: a pool has no /dev/shm to size
POOL_RESOURCE_FIELDS = tuple(f for f in RESOURCE_FIELDS if f != "shmSize")
NOT_BUILT = "is not built yet with spec.disaggregation"


def read_disaggregation(
    r: Reader,
    spec: Mapping[str, Any],
    name: str,
    *,
    resources: Resources,
    autoscaling: Autoscaling,
    runtime: RuntimeOptions,
    inference_pool: InferencePoolOptions,
) -> Disaggregation:
    """`resources`, `autoscaling`: the service's, which a pool falls back to."""
    p = "spec.disaggregation"
    d = r.mapping(spec, "disaggregation", p)
    r.known(d, DISAGGREGATION_FIELDS, p)
    enabled = r.boolean(d, "enabled", f"{p}.enabled", default=False)
    port = r.integer(
        d, "bootstrapPort", f"{p}.bootstrapPort", default=rc.DISAGG_DEFAULT_BOOTSTRAP_PORT,
        minimum=1, maximum=65535,
    ) or rc.DISAGG_DEFAULT_BOOTSTRAP_PORT  # fmt: skip
    if port == rc.DEFAULT_PORT:
        r.fail(f"{p}.bootstrapPort", f"{port} is the pods' HTTP port; choose another")
    prefill, decode = (_pool(r, d, role, f"{p}.{role}", resources, autoscaling) for role in c.ROLES)
    if enabled:
        _check_supported(r, spec, name, autoscaling, runtime, inference_pool, (prefill, decode))
    return Disaggregation(enabled, prefill, decode, port)


def _pool(
    r: Reader,
    d: Mapping[str, Any],
    role: str,
    p: str,
    resources: Resources,
    autoscaling: Autoscaling,
) -> PoolSpec:
    pool = r.mapping(d, role, p)
    r.known(pool, POOL_FIELDS, p)
    replicas = r.integer(
        pool, "replicas", f"{p}.replicas", default=c.DEFAULT_POOL_REPLICAS,
        minimum=1, maximum=c.MAX_REPLICAS,
    ) or c.DEFAULT_POOL_REPLICAS  # fmt: skip
    own_metrics = tuple(MetricTarget(t, v) for t, v in c.DEFAULT_POOL_METRICS[role])
    scaling = read_autoscaling(
        r, pool, f"{p}.autoscaling",
        defaults=dataclasses.replace(autoscaling, metrics=own_metrics),
        metric_types=c.POOL_METRIC_TYPES[role], policies=(c.POLICY_HPA,),
    )  # fmt: skip
    return PoolSpec(
        role=role,
        replicas=replicas,
        resources=read_resources(
            r, pool, f"{p}.resources", defaults=resources, fields=POOL_RESOURCE_FIELDS
        ),
        autoscaling=scaling,
    )


def _check_supported(
    r: Reader,
    spec: Mapping[str, Any],
    name: str,
    autoscaling: Autoscaling,
    runtime: RuntimeOptions,
    inference_pool: InferencePoolOptions,
    pools: tuple[PoolSpec, ...],
) -> None:
    p = "spec.disaggregation"
    if len(name) > c.MAX_DISAGGREGATED_NAME_LENGTH:
        r.fail(
            "metadata.name",
            f"must be at most {c.MAX_DISAGGREGATED_NAME_LENGTH} characters with"
            f" {p}.enabled (it also names the Deployments {name}-prefill and {name}-decode)",
        )
    if runtime.tensor_parallel_size > 1:
        r.fail(
            "spec.runtime.tensorParallelSize",
            f"tensor parallelism ({runtime.tensor_parallel_size}) {NOT_BUILT}: one GPU per pod",
        )
    if autoscaling.policy == c.POLICY_SATURATION:
        r.fail(
            "spec.autoscaling.policy",
            f"saturation {NOT_BUILT} (its recording rule sizes whole-request servers): use hpa,"
            " the pools' policy",
        )
    for pool in pools:
        if pool.resources.gpus > 1 and runtime.tensor_parallel_size == 1:
            r.fail(
                f"{p}.{pool.role}.resources.gpus",
                f"{pool.resources.gpus} GPUs would need tensor parallelism, which {NOT_BUILT}",
            )
        if runtime.attention_backend == "flashinfer" and pool.resources.gpus == 0:
            r.fail(
                "spec.runtime.attentionBackend", f"flashinfer needs GPUs in the {pool.role} pool"
            )
    router = spec.get("router")
    if isinstance(router, Mapping) and router.get("enabled") is False:
        r.fail(
            "spec.router.enabled",
            f"must not be false with {p}.enabled: the router pairs a prefill and a decode pod"
            " per request (P/D servers refuse requests that do not come from it)",
        )
    if inference_pool.enabled:
        r.fail(
            "spec.inferencePool.enabled",
            f"an InferencePool {NOT_BUILT}: its endpoint picker would send whole requests to"
            " P/D servers, which refuse them",
        )
