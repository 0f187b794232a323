"""Reading the routing parts of a spec: `spec.router` (a `sluice router` in front of the
runtime pods) and `spec.inferencePool` (the Gateway API Inference Extension's pool of
them). Part of `parse_spec`; the CRD repeats every rule (CEL for the cross-field ones)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .spec import InferencePoolOptions, RouterOptions, RuntimeOptions
from .validation import DNS1035_LABEL, IMAGE, Reader

ROUTER_FIELDS = ("enabled", "image", "replicas", "policy", "resources")
INFERENCE_POOL_FIELDS = ("enabled", "endpointPickerRef")
ENDPOINT_PICKER_FIELDS = ("name", "port", "failureMode")


def read_router(
    r: Reader, spec: Mapping[str, Any], name: str, default_image: str = c.DEFAULT_ROUTER_IMAGE
) -> RouterOptions:
    p = "spec.router"
    router = r.mapping(spec, "router", p)
    r.known(router, ROUTER_FIELDS, p)
    enabled = r.boolean(router, "enabled", f"{p}.enabled", default=False)
    image = r.string(router, "image", f"{p}.image", default=default_image, pattern=IMAGE)
    replicas = r.integer(
        router, "replicas", f"{p}.replicas", default=c.DEFAULT_ROUTER_REPLICAS,
        minimum=1, maximum=c.MAX_ROUTER_REPLICAS,
    )  # fmt: skip
    policy = r.string(
        router, "policy", f"{p}.policy", default=c.DEFAULT_ROUTER_POLICY,
        choices=rc.ROUTER_POLICIES,
    )  # fmt: skip
    resources = r.mapping(router, "resources", f"{p}.resources")
    r.known(resources, ("cpu", "memory"), f"{p}.resources")
    if enabled and len(name) > c.MAX_ROUTED_NAME_LENGTH:
        r.fail(
            "metadata.name",
            f"must be at most {c.MAX_ROUTED_NAME_LENGTH} characters with spec.router.enabled"
            f" (it also names the Deployment {name}{c.ROUTER_SUFFIX})",
        )
    return RouterOptions(
        enabled=enabled,
        image=image or default_image,
        replicas=replicas or c.DEFAULT_ROUTER_REPLICAS,
        policy=policy or c.DEFAULT_ROUTER_POLICY,
        cpu=r.quantity(resources, "cpu", f"{p}.resources.cpu"),
        memory=r.quantity(resources, "memory", f"{p}.resources.memory"),
    )


def read_inference_pool(r: Reader, spec: Mapping[str, Any]) -> InferencePoolOptions:
    p = "spec.inferencePool"
    pool = r.mapping(spec, "inferencePool", p)
    r.known(pool, INFERENCE_POOL_FIELDS, p)
    ref = r.mapping(pool, "endpointPickerRef", f"{p}.endpointPickerRef")
    q = f"{p}.endpointPickerRef"
    r.known(ref, ENDPOINT_PICKER_FIELDS, q)
    picker = r.string(ref, "name", f"{q}.name", pattern=DNS1035_LABEL, max_length=63)
    port = r.integer(ref, "port", f"{q}.port", default=c.DEFAULT_EPP_PORT, minimum=1,
                     maximum=65535)  # fmt: skip
    mode = r.string(ref, "failureMode", f"{q}.failureMode", default=c.DEFAULT_EPP_FAILURE_MODE,
                    choices=c.EPP_FAILURE_MODES)  # fmt: skip
    return InferencePoolOptions(
        enabled=r.boolean(pool, "enabled", f"{p}.enabled", default=False),
        endpoint_picker=picker,
        endpoint_picker_port=port or c.DEFAULT_EPP_PORT,
        failure_mode=mode or c.DEFAULT_EPP_FAILURE_MODE,
    )


def check_metrics_compat(r: Reader, runtime: RuntimeOptions, pool: InferencePoolOptions) -> None:
    """With an InferencePool the operator sets `--metrics-compat` itself (the endpoint
    picker reads vLLM's names); extraArgs may not set it, nor abbreviate it."""
    if not pool.enabled:
        return
    for index, arg in enumerate(runtime.extra_args):
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and rc.FLAG_METRICS_COMPAT.startswith(flag):
            r.fail(
                f"spec.runtime.extraArgs[{index}]",
                f"{rc.FLAG_METRICS_COMPAT} is set by the operator while spec.inferencePool.enabled",
            )
