"""Object-level flows the Kopf handlers call: converge one InferenceService, refresh its
status from a Deployment event. Everything here is reached with explicit arguments
(settings, API client, clock); nothing reads globals or the environment.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import kopf

from . import constants as c
from .kube import DEPLOYMENTS, INFERENCESERVICES, PODMONITORS, ApiError, KubeApi
from .parsing import parse_spec
from .reconcile import apply_plan, as_kopf_error, plan
from .settings import Settings
from .spec import InferenceServiceSpec
from .status import Observed, compute_status, status_changed
from .validation import SpecError

Clock = Callable[[], str]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Context:
    """What a flow needs besides the object: configuration, API access, a clock."""

    settings: Settings
    api: KubeApi
    clock: Clock = utc_now


def read_spec(body: Mapping[str, Any], settings: Settings) -> InferenceServiceSpec:
    """Parse the body's spec; raises SpecError."""
    meta = body.get("metadata") or {}
    spec = copy.deepcopy(dict(body.get("spec") or {}))
    return parse_spec(meta["name"], meta["namespace"], spec, default_image=settings.default_image)


async def failed_status(
    body: Mapping[str, Any], reason: str, message: str, ctx: Context
) -> dict[str, Any]:
    """Status for a spec that cannot be applied: phase Failed with the reason; the counts and
    conditions still describe the Deployment of the last good spec, which keeps serving."""
    deployment = await _owned_deployment(body, ctx)
    return status_with(
        body, deployment, ctx, generation=_generation(body), failure=(reason, message)
    )


def status_with(
    body: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
    ctx: Context,
    *,
    generation: int | None,
    failure: tuple[str, str] | None = None,
    default_replicas: int = 1,
    served_model_name: str | None = None,
) -> dict[str, Any]:
    """The status of `body` given its Deployment; `generation` becomes observedGeneration
    (None leaves the recorded one alone)."""
    meta = body.get("metadata") or {}
    previous = body.get("status") or {}
    observed = Observed(
        name=meta["name"],
        namespace=meta["namespace"],
        generation=generation,
        deployment=deployment,
        default_replicas=default_replicas,
        served_model_name=served_model_name or previous.get("servedModelName"),
        failure_reason=failure[0] if failure else None,
        failure_message=failure[1] if failure else "",
    )
    return compute_status(
        observed, previous=previous, now=ctx.clock(), cluster_domain=ctx.settings.cluster_domain
    )


def _generation(body: Mapping[str, Any]) -> int | None:
    generation: int | None = (body.get("metadata") or {}).get("generation")
    return generation


async def _owned_deployment(body: Mapping[str, Any], ctx: Context) -> dict[str, Any] | None:
    """The Deployment this InferenceService controls, if any (None if unreadable now)."""
    meta = body.get("metadata") or {}
    try:
        deployment = await ctx.api.get(DEPLOYMENTS, meta["namespace"], meta["name"])
    except ApiError:
        return None
    if deployment is None or controller_of(deployment) != (meta["name"], meta.get("uid")):
        return None
    return deployment


async def converge(
    body: Mapping[str, Any], isvc: InferenceServiceSpec, ctx: Context, logger: kopf.Logger
) -> dict[str, Any]:
    """Apply the children of a valid spec; return the new status."""
    try:
        podmonitors = await _podmonitors_wanted(ctx)
    except ApiError as error:
        raise as_kopf_error(error, ctx.settings.retry_delay_seconds) from error
    deployment = await apply_plan(
        ctx.api,
        plan(isvc, podmonitors=podmonitors),
        owner=body,
        namespace=isvc.namespace,
        name=isvc.name,
        retry_delay=ctx.settings.retry_delay_seconds,
        logger=logger,
    )
    return status_with(
        body,
        deployment,
        ctx,
        generation=_generation(body),
        default_replicas=isvc.min_serving_replicas,
        served_model_name=isvc.model.served_name,
    )


async def _podmonitors_wanted(ctx: Context) -> bool | None:
    if not await ctx.api.serves(PODMONITORS):
        return None
    return ctx.settings.pod_monitors == "auto"


def controller_of(child: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the InferenceService that controls `child`, if any."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == c.KIND
            and ref.get("apiVersion", "").startswith(f"{c.GROUP}/")
        ):
            return ref["name"], ref["uid"]
    return None


async def on_deployment_event(
    event_type: str | None, deployment: Mapping[str, Any], ctx: Context, logger: kopf.Logger
) -> None:
    """Mirror a Deployment change into its owner's status; recreate it if it was deleted."""
    owner = controller_of(deployment)
    if owner is None:
        return
    name, uid = owner
    namespace = deployment["metadata"]["namespace"]
    body = await ctx.api.get(INFERENCESERVICES, namespace, name)
    if (
        body is None
        or body["metadata"].get("uid") != uid
        or body["metadata"].get("deletionTimestamp")
    ):
        return  # the owner is gone or going: garbage collection takes care of the rest
    current = None if event_type == "DELETED" else deployment
    try:
        isvc = read_spec(body, ctx.settings)
    except SpecError as error:
        failure = (c.REASON_INVALID_SPEC, str(error))
        status = status_with(body, current, ctx, generation=_generation(body), failure=failure)
    else:
        if current is None:
            logger.info(f"Deployment {namespace}/{name} was deleted; recreating it.")
            status = await converge(body, isvc, ctx, logger)
        else:
            status = status_with(
                body,
                current,
                ctx,
                generation=(body.get("status") or {}).get("observedGeneration"),
                default_replicas=isvc.min_serving_replicas,
                served_model_name=isvc.model.served_name,
            )
    if status_changed(body.get("status") or {}, status):
        await ctx.api.patch_status(INFERENCESERVICES, namespace, name, status)
