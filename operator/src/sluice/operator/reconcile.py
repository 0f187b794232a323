"""One reconcile of one InferenceService: read it, converge its children, write its status.

Every trigger runs this same function (controller.py queues it): a spec change, a change
or deletion of any child, a pod's change, the periodic resync, a retry. It reads
everything fresh, so it is idempotent and order-free: running it twice changes nothing the
second time (server-side apply of an unchanged object is a no-op; an unchanged status is
not written; Events are posted for transitions only).

Steps: the object (gone: stop) → its spec (invalid: status Failed, wait for a change) →
the children that exist (someone else's, or a deleted predecessor's awaiting garbage
collection: status, retry with back-off) → who owns the Deployment's replica count
(replicas.py) → apply and delete children (a rejected object: status Failed, retried at
the next resync; a denied one, 403: status Failed with reason Forbidden, retried with
back-off; a transient API error propagates: back-off) → the current ReplicaSet and its
pods → the status, written once, only if the object has not changed since it was read.

An optional kind (PodMonitor, InferencePool) the API server denies is left alone: the
reconcile runs again without it and the OptionalResourcesAvailable condition says so.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any

import kopf

from . import constants as c
from .builders.common import selector_labels
from .cache import Cache, CachedApi
from .children import (
    Applied,
    Blocked,
    Key,
    Plan,
    apply_children,
    check_ownership,
    key_of,
    owned_by,
    plan,
    read_children,
)
from .conditions import RuntimePods
from .events import post_event
from .kube import (
    DEPLOYMENTS,
    INFERENCEPOOLS,
    INFERENCESERVICES,
    PODMONITORS,
    ApiError,
    KubeApi,
    Resource,
)
from .observe import read_pods, read_router_pods, read_runtime_pods
from .optional import (
    OPTIONAL_RESOURCES,
    USED,
    OptionalApis,
    OptionalForbidden,
    OptionalState,
)
from .parsing import parse_spec
from .replicas import decide_for, handover_object
from .revisions import ModelPin, RevisionError, pin_model, pinned
from .settings import Settings
from .spec import InferenceServiceSpec
from .status import (
    Failure,
    Observed,
    capacity_recheck,
    compute_status,
    status_changed,
    transition_events,
)
from .validation import SpecError

logger = logging.getLogger("sluice.operator")
Clock = Callable[[], str]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Context:
    """What a reconcile needs besides the key: configuration, API access (through the
    watch cache: cache.py), the optional APIs' state, a clock."""

    settings: Settings
    api: CachedApi
    optional: OptionalApis
    clock: Clock = utc_now

    @classmethod
    def create(cls, settings: Settings, api: KubeApi, cache: Cache) -> Context:
        return cls(
            settings=settings,
            api=CachedApi(api, cache, fresh=True),
            optional=OptionalApis(api, settings),
        )

    @property
    def cache(self) -> Cache:
        return self.api.cache

    def reading(self, *, fresh: bool) -> Context:
        """This context for one reconcile: reads from the cache, or `fresh` ones."""
        return dataclasses.replace(self, api=CachedApi(self.api.api, self.cache, fresh=fresh))


@dataclass(frozen=True)
class Outcome:
    """`retry`: back off and run again; `gone`: the object no longer exists; `recheck`:
    run again within this many seconds though nothing changes (a pod's scheduling grace
    ends then)."""

    retry: bool = False
    gone: bool = False
    recheck: float | None = None


DONE, RETRY, GONE = Outcome(), Outcome(retry=True), Outcome(gone=True)


Wanted = tuple[int, str | None]


def wanted(body: Mapping[str, Any]) -> Wanted:
    """What a reconcile converges to: the spec's generation, and the annotation that asks
    for a new revision pin (metadata, so it moves no generation)."""
    meta = body.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    return int(meta.get("generation") or 0), annotations.get(c.ANNOTATION_REFRESH_REVISION)


class StatusConflict(Exception):
    """The object changed between reading it and writing its status."""


def default_image(body: Mapping[str, Any], settings: Settings) -> str:
    """The image for a spec without `spec.image`: the one recorded in the status while the
    spec is unchanged since (an operator upgrade does not roll the fleet), otherwise the
    operator's default. (`reconcile` still moves to the default when the pods must change
    anyway: see `_keeps_pods`.)"""
    status = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    if (
        not settings.roll_on_upgrade
        and status.get("image")
        and status.get("observedGeneration") == generation
    ):
        return str(status["image"])
    return settings.default_image


def read_spec(body: Mapping[str, Any], settings: Settings) -> InferenceServiceSpec:
    """Parse the body's spec; raises SpecError."""
    meta = body.get("metadata") or {}
    spec = copy.deepcopy(dict(body.get("spec") or {}))
    image = default_image(body, settings)
    return parse_spec(
        meta["name"], meta["namespace"], spec,
        default_image=image, router_image=settings.router_image,
    )  # fmt: skip


async def reconcile(
    key: tuple[str, str],
    ctx: Context,
    seen: Callable[[Wanted], None] | None = None,
    *,
    fresh: bool = True,
) -> Outcome:
    """`seen(wanted)` is told what this run converges (`wanted`), as soon as it is read.
    `fresh`: read everything from the API server (the resync, a retry), not from the
    watch cache."""
    namespace, name = key
    ctx = ctx.reading(fresh=fresh)
    body = await ctx.api.get(INFERENCESERVICES, namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return GONE  # garbage collection removes the children
    if seen is not None:
        seen(wanted(body))
    try:
        isvc = read_spec(body, ctx.settings)
    except SpecError as error:
        return await _report_failure(ctx, body, Failure(c.REASON_INVALID_SPEC, str(error)), DONE)

    try:
        pin = await pin_model(
            ctx.api.api,  # the token Secret is read fresh and never cached
            body,
            isvc,
            default_endpoint=ctx.settings.hf_endpoint,
            timeout=ctx.settings.api_timeout_seconds,
        )
    except RevisionError as error:
        logger.warning(f"[{namespace}/{name}] {error}")
        phase = c.PHASE_PENDING if error.transient else c.PHASE_FAILED
        failure = Failure(c.REASON_REVISION_UNRESOLVED, str(error), phase)
        return await _report_failure(ctx, body, failure, RETRY)  # a Deployment keeps its pin
    isvc = pinned(isvc, pin)

    optional = {
        resource: await ctx.optional.state(resource, namespace) for resource in OPTIONAL_RESOURCES
    }
    while True:  # once more per optional kind the API server denies
        try:
            return await _converge(ctx, body, isvc, optional, pin)
        except OptionalForbidden as denied:
            logger.warning(
                f"[{namespace}/{name}] {denied.resource.kind} denied; going on without it:"
                f" {denied.message}"
            )
            optional[denied.resource] = ctx.optional.deny(
                denied.resource, namespace, denied.message
            )


async def _converge(
    ctx: Context,
    body: Mapping[str, Any],
    isvc: InferenceServiceSpec,
    optional: Mapping[Resource, OptionalState],
    pin: ModelPin | None,
) -> Outcome:
    """Apply the children and report; a 403 for a required object is a Forbidden status
    (retried with back-off), one for an optional kind raises OptionalForbidden."""
    namespace, name = isvc.namespace, isvc.name
    states = tuple(optional.values())
    existing: dict[Key, dict[str, Any] | None] = {}
    try:
        return await _apply_and_observe(ctx, body, isvc, optional, existing, pin)
    except ApiError as error:
        if error.namespace_terminating:
            logger.info(f"[{namespace}/{name}] namespace {namespace} is being deleted; dropped")
            return GONE
        if not error.forbidden:
            raise
        deployment = existing.get((DEPLOYMENTS.kind, name))
        if deployment is not None and not owned_by(deployment, body["metadata"]["uid"]):
            deployment = None
        failure = Failure(c.REASON_FORBIDDEN, error.message)
        observed = failed_observation(body, deployment, failure=failure, optional=states)
        logger.warning(f"[{namespace}/{name}] Forbidden: {error.message}")
        return await _report(ctx, body, observed, RETRY)


async def _apply_and_observe(
    ctx: Context,
    body: Mapping[str, Any],
    isvc: InferenceServiceSpec,
    optional: Mapping[Resource, OptionalState],
    existing: dict[Key, dict[str, Any] | None],
    pin: ModelPin | None,
) -> Outcome:
    namespace, name = isvc.namespace, isvc.name
    states = tuple(optional.values())
    podmonitors = _podmonitors_wanted(ctx, optional[PODMONITORS])
    inferencepools = True if optional[INFERENCEPOOLS].state == USED else None
    probe = plan(isvc, podmonitors=podmonitors, inferencepools=inferencepools)
    existing.update(await read_children(ctx.api, probe, namespace))
    uid = body["metadata"]["uid"]
    try:
        check_ownership(probe, existing, body)
    except Blocked as blocked:
        phase = c.PHASE_PENDING if blocked.reason == c.REASON_WAITING_FOR_GC else c.PHASE_FAILED
        failure = Failure(blocked.reason, str(blocked), phase)
        deployment = existing.get((DEPLOYMENTS.kind, name))
        if deployment is not None and not owned_by(deployment, uid):
            deployment = None
        observed = failed_observation(body, deployment, failure=failure, optional=states)
        return await _report(ctx, body, observed, RETRY)

    # each runtime Deployment's count (the service's, or each P/D pool's): replicas.py
    ours = partial(owned_by, owner_uid=uid)
    decisions = {view.runtime_name: decide_for(view, existing, ours) for view in isvc.runtime_views}
    copy = decisions[name].copy_to_spec if name in decisions else None
    if copy is not None:
        logger.info(
            f"[{namespace}/{name}] autoscaling is off: keeping the autoscaler's"
            f" {copy} replicas (spec.replicas {isvc.replicas} → {copy})"
        )
        await ctx.api.scale(INFERENCESERVICES, namespace, name, copy)
        isvc = dataclasses.replace(isvc, replicas=copy)
        body = await ctx.api.get(INFERENCESERVICES, namespace, name) or body
    for deployment_name, decision in decisions.items():
        if decision.handover is not None:
            await _hand_over(ctx.api, namespace, deployment_name, decision.handover)

    # the model Service selects the router pods only while an available router replica
    # (ours) exists; otherwise the runtime pods, so the API never loses its endpoints. P/D
    # pods serve only the router's requests: then it always selects the router pods
    router = existing.get((DEPLOYMENTS.kind, isvc.router_name))
    to_router = isvc.disaggregation.enabled or (
        isvc.router.enabled
        and router is not None
        and owned_by(router, uid)
        and router_serves(router)
    )

    def wanted_plan(isvc: InferenceServiceSpec) -> Plan:
        return plan(
            isvc,
            podmonitors=podmonitors,
            inferencepools=inferencepools,
            replicas={n: d.deployment_replicas for n, d in decisions.items()},
            run_as_user=ctx.settings.run_as_user,
            to_router=to_router,
        )

    wanted = wanted_plan(isvc)
    if isvc.image != ctx.settings.default_image and not (body.get("spec") or {}).get("image"):
        if not await _keeps_pods(ctx.api, isvc, wanted, existing, body):
            # the pods are (re)made anyway: make them with the current default image
            isvc = dataclasses.replace(isvc, image=ctx.settings.default_image)
            wanted = wanted_plan(isvc)
    try:
        applied = await apply_children(ctx.api, wanted, existing, owner=body)
    except ApiError as error:
        if error.transient or error.forbidden:
            raise
        failure = Failure(c.REASON_APPLY_FAILED, f"Kubernetes API rejected a child object: {error}")
        deployment = existing.get((DEPLOYMENTS.kind, name))
        observed = failed_observation(body, deployment, failure=failure, optional=states)
        return await _report(ctx, body, observed, DONE)
    for deployment_name, decision in decisions.items():
        if decision.release_handover:
            await _hand_over(ctx.api, namespace, deployment_name, None)
    await _announce(ctx, body, applied)

    runtime = {
        view.role: await read_runtime_pods(ctx.api, view, applied.objects)
        for view in isvc.runtime_views
    }
    whole = runtime.get(None) or RuntimePods(None)  # without disaggregation
    observed = Observed(
        name=name,
        namespace=namespace,
        generation=body["metadata"].get("generation"),
        deployment=whole.deployment,
        replica_set=whole.replica_set,
        pods=whole.pods,
        hpa=whole.hpa,
        autoscaling=whole.autoscaling,
        min_replicas=whole.min_replicas,
        default_replicas=whole.default_replicas,
        served_model_name=isvc.model.served_name,
        image=isvc.image,
        model_pin=pin,
        router=await read_router_pods(ctx.api, isvc, applied.objects, to_router),
        optional=states,
        pools={role: pods for role, pods in runtime.items() if role is not None},
    )
    return await _report(ctx, body, observed, DONE)


def router_serves(router: Mapping[str, Any]) -> bool:
    """Whether the router Deployment has a replica that serves: then the model Service
    may select the router pods (until then, and whenever none is available, it selects
    the runtime pods, so the API never loses its endpoints to the router)."""
    return int((router.get("status") or {}).get("availableReplicas") or 0) > 0


def failed_observation(
    body: Mapping[str, Any],
    deployment: Mapping[str, Any] | None,
    *,
    failure: Failure,
    optional: tuple[OptionalState, ...] = (),
) -> Observed:
    """The status input when the spec was not applied: the last good children keep serving."""
    meta = body["metadata"]
    previous = body.get("status") or {}
    return Observed(
        name=meta["name"],
        namespace=meta["namespace"],
        generation=meta.get("generation"),
        deployment=deployment,
        served_model_name=previous.get("servedModelName"),
        failure=failure,
        optional=optional,
    )


async def _report_failure(
    ctx: Context, body: Mapping[str, Any], failure: Failure, outcome: Outcome
) -> Outcome:
    """Report a reconcile that stopped before applying anything; the Deployment it owns
    (if any) still runs and its counts are reported."""
    deployment = await _owned(ctx.api, body)
    return await _report(ctx, body, failed_observation(body, deployment, failure=failure), outcome)


async def _owned(api: CachedApi, body: Mapping[str, Any]) -> dict[str, Any] | None:
    meta = body["metadata"]
    deployment = await api.get(DEPLOYMENTS, meta["namespace"], meta["name"])
    if deployment is None or not owned_by(deployment, meta["uid"]):
        return None
    return deployment


async def _keeps_pods(
    api: CachedApi,
    isvc: InferenceServiceSpec,
    wanted: Plan,
    existing: Mapping[Key, Mapping[str, Any] | None],
    owner: Mapping[str, Any],
) -> bool:
    """Whether applying the planned runtime Deployments (the service's, or its P/D pools')
    leaves every one's pod template as it is, none being new (a dry run: the API server
    answers with the object as it would store it, defaults and all, so it compares like
    for like with the stored one)."""
    planned = {key_of(child): child for child in wanted.apply}
    for key in ((DEPLOYMENTS.kind, view.runtime_name) for view in isvc.runtime_views):
        current = existing.get(key)
        if current is None:
            return False
        deployment = dict(planned[key])
        kopf.adopt(deployment, owner=owner)  # type: ignore[arg-type]
        would_be = await api.apply(deployment, dry_run=True)
        template: Any = (would_be.get("spec") or {}).get("template")
        if template != (current.get("spec") or {}).get("template"):
            return False
    return True


def _podmonitors_wanted(ctx: Context, state: OptionalState) -> bool | None:
    """True: create ours; False: delete ours; None: leave the kind alone."""
    if state.state != USED:
        return None
    return ctx.settings.pod_monitors == "auto"


async def _hand_over(api: CachedApi, namespace: str, name: str, replicas: int | None) -> None:
    """Co-own spec.replicas under the hand-over manager (None: release it); a conflict
    means the HPA has already taken the field, which is what the hand-over waits for."""
    try:
        await api.apply(
            handover_object(name, namespace, replicas),
            manager=c.HANDOVER_FIELD_MANAGER,
            force=False,
        )
    except ApiError as error:
        if error.status != 409:
            raise


async def _announce(ctx: Context, body: Mapping[str, Any], applied: Applied) -> None:
    meta = body["metadata"]
    for reason, keys, why in (
        ("Created", applied.created, ""),
        ("Adopted", applied.adopted, ": an orphan of this service"),
        ("Deleted", applied.deleted, ": no longer wanted"),
    ):
        for kind, child in keys:
            message = f"{reason} {kind} {meta['namespace']}/{child}{why}."
            logger.info(message)
            await post_event(ctx.api, body, "Normal", reason, message, ctx.clock())


async def _report(
    ctx: Context, body: Mapping[str, Any], observed: Observed, outcome: Outcome
) -> Outcome:
    """Write the status if it changed (only over the version read), then post the Events
    of its transitions."""
    if observed.deployment is not None and observed.failure is not None:
        replica_set, pods = await read_pods(
            ctx.api, observed.deployment, selector_labels(observed.name)
        )
        observed = dataclasses.replace(observed, replica_set=replica_set, pods=pods)
    previous = body.get("status") or {}
    now = ctx.clock()
    grace = ctx.settings.scheduling_grace_seconds
    status = compute_status(
        observed,
        previous=previous,
        now=now,
        cluster_domain=ctx.settings.cluster_domain,
        scheduling_grace_seconds=grace,
    )
    recheck = capacity_recheck(observed, now=now, grace_seconds=grace)
    if recheck is not None:
        outcome = dataclasses.replace(outcome, recheck=recheck + 1)
    if not status_changed(previous, status):
        return outcome
    meta = body["metadata"]
    try:
        await ctx.api.patch_status(
            INFERENCESERVICES,
            meta["namespace"],
            meta["name"],
            status,
            resource_version=meta["resourceVersion"],
        )
    except ApiError as error:
        if error.status == 409:
            raise StatusConflict(str(error)) from error
        raise
    where = f"{meta['namespace']}/{meta['name']}"
    if observed.failure is not None and (previous.get("phase"), _ready_reason(previous)) != (
        status["phase"],
        observed.failure.reason,
    ):
        logger.warning(f"[{where}] {observed.failure.reason}: {observed.failure.message}")
    for event in transition_events(previous, status):
        await post_event(ctx.api, body, event.type, event.reason, event.message, ctx.clock())
    return outcome


def _ready_reason(status: Mapping[str, Any]) -> str | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == c.CONDITION_READY:
            return str(cond.get("reason"))
    return None
