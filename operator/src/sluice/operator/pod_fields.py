"""Reading the pod-level parts of a spec: scheduling, environment, pod options (service
account, pull secrets, labels, annotations) and the NetworkPolicy. Part of `parse_spec`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .spec import NetworkPolicy, PodOptions, Scheduling
from .validation import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    ENV_NAME,
    LABEL_VALUE,
    Reader,
    check_label_key,
)

TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

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
    c.LABEL_DISAGGREGATION_MODE,
)


def read_scheduling(r: Reader, spec: Mapping[str, Any]) -> Scheduling:
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


def read_env(r: Reader, spec: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
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


def read_pod_options(r: Reader, spec: Mapping[str, Any]) -> PodOptions:
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


def read_network_policy(r: Reader, spec: Mapping[str, Any]) -> NetworkPolicy:
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
