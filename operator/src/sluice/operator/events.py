"""Kubernetes Events about an InferenceService (`kubectl describe` shows them).

Posted by the reconcile, not by Kopf: outside a handler there is no Kopf context to post
from, and the operator decides itself which changes are worth one (status.transition_events
and the Created/Deleted children). A failure to post is logged, never fatal.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from typing import Any

from . import constants as c
from .cache import CachedApi
from .kube import EVENTS, ApiError

logger = logging.getLogger("sluice.operator")


def event_object(
    owner: Mapping[str, Any], type_: str, reason: str, message: str, now: str
) -> dict[str, Any]:
    """A core/v1 Event about `owner` (an InferenceService)."""
    meta = owner["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta['name']}.{secrets.token_hex(8)}",
            "namespace": meta["namespace"],
        },
        "involvedObject": {
            "apiVersion": owner.get("apiVersion", c.API_VERSION),
            "kind": owner.get("kind", c.KIND),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid", ""),
            "resourceVersion": meta.get("resourceVersion", ""),
        },
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": c.EVENT_SOURCE},
        "reportingComponent": c.EVENT_SOURCE,
        "reportingInstance": c.EVENT_SOURCE,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


async def post_event(
    api: CachedApi, owner: Mapping[str, Any], type_: str, reason: str, message: str, now: str
) -> None:
    event = event_object(owner, type_, reason, message, now)
    try:
        await api.create(EVENTS, owner["metadata"]["namespace"], event)
    except ApiError as error:
        logger.warning(f"could not post the {reason} event: {error}")
