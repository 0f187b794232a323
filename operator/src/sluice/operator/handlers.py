"""Kopf handlers: thin wrappers that read the object, call the controller, report.

Progress storage: annotations (`sluice.dev/<handler>` and
`sluice.dev/last-handled-configuration`), not status. The status is a user-facing API
with a strict schema (phase, conditions, counts) and is also written from Deployment
events outside Kopf's handler cycle; keeping Kopf's bookkeeping out of it keeps
`kubectl get -o yaml` clean, needs no `x-kubernetes-preserve-unknown-fields` hole in the
status schema, and survives tools that rewrite status.

Retry semantics: an invalid spec is reported (status `Failed`, a `InvalidSpec` Warning
Event) and raised as `kopf.PermanentError`, so it is not retried until the spec changes;
API trouble is a `kopf.TemporaryError` retried after `retry_delay_seconds`.

High availability: run one replica with `--standalone` (the default), or several with
Kopf peering — see operator/README.md.
"""

from __future__ import annotations

import os
from typing import Any

import kopf

from . import constants as c
from .auth import login
from .controller import Context, converge, failed_status, on_deployment_event, read_spec
from .kube import KubeApi
from .reconcile import ReconcileError
from .settings import Settings
from .validation import SpecError

ISVC = (c.GROUP, c.VERSION, c.PLURAL)
OWNED_DEPLOYMENTS = {c.LABEL_MANAGED_BY: c.MANAGER_LABEL_VALUE}


def configure_kopf(kopf_settings: kopf.OperatorSettings) -> None:
    prefix = c.ANNOTATION_PREFIX
    kopf_settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=prefix)
    kopf_settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=prefix, key="last-handled-configuration"
    )
    kopf_settings.persistence.finalizer = f"{prefix}/finalizer"
    # Events on the InferenceService are posted explicitly (Created, Deleted, InvalidSpec,
    # ApplyFailed, NameConflict), not from every log line.
    kopf_settings.posting.loggers = False


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    ours = memo.get("settings") or Settings.from_env(os.environ)
    memo["settings"] = ours
    memo["context"] = Context(settings=ours, api=KubeApi(timeout=ours.api_timeout_seconds))
    configure_kopf(settings)
    logger.info(
        f"Sluice operator starting: default image {ours.default_image}, pod monitors {ours.pod_monitors}."
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    context: Context | None = memo.get("context")
    if context is not None:
        await context.api.close()


@kopf.on.login()
async def authenticate(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo:
    info = login(memo=memo, **kwargs)
    memo["context"].api.use(info)
    return info


@kopf.on.resume(*ISVC)
@kopf.on.create(*ISVC)
@kopf.on.update(*ISVC)
async def reconcile(
    body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    ctx: Context = memo["context"]
    try:
        isvc = read_spec(body, ctx.settings)
    except SpecError as error:
        patch.status.update(await failed_status(body, c.REASON_INVALID_SPEC, str(error), ctx))
        kopf.warn(body, reason=c.REASON_INVALID_SPEC, message=str(error))
        raise kopf.PermanentError(f"Invalid spec: {error}") from error
    try:
        patch.status.update(await converge(body, isvc, ctx, logger))
    except ReconcileError as error:
        patch.status.update(await failed_status(body, error.reason, str(error), ctx))
        raise


@kopf.on.event("apps", "v1", "deployments", labels=OWNED_DEPLOYMENTS)
async def deployment_changed(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    await on_deployment_event(type, body, memo["context"], logger)
