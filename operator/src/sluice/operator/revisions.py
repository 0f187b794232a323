"""`hf://` models pinned to the commit they resolved to (as OME and KServe do).

`spec.model.revision` may be a branch or tag (`main` when unset): what it names moves when
the repository gets a commit. Without a pin, a rollout, a rescheduled pod or a scale-up
would download whatever it names at that moment, and replicas of one service could serve
different weights. So the operator resolves it once, through the Hub API
(`GET {endpoint}/api/models/{repo}/revision/{revision}`, the `sha` of the answer), with the
token of `spec.model.tokenSecretRef` and the `HF_ENDPOINT` of `spec.env` (a mirror) when
given, and:

- records it in `status.model` (`revision`, and `requested`: what it resolved);
- puts the commit in the download container (`SLUICE_MODEL_REVISION`), so every pod of
  the template fetches exactly that commit.

The pin is kept while `requested` still describes the spec: other spec changes (replicas,
resources, an env var) roll pods on the same commit. A new repo or revision resolves
again; so does a new value of the annotation `sluice.dev/refresh-revision` (to move a
service to the current head of its branch on purpose). A revision that already is a
40-hex commit is used as it is, without a request.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from . import constants as c
from .kube import SECRETS, KubeApi
from .spec import InferenceServiceSpec

COMMIT = re.compile(r"^[0-9a-f]{40}$")
DEFAULT_REVISION = "main"


class RevisionError(Exception):
    """The revision could not be resolved (the reason names what to fix)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


@dataclass(frozen=True)
class ModelPin:
    """What status.model records."""

    requested: str  # "org/name@revision[#refresh]"
    revision: str  # the commit

    def status(self) -> dict[str, Any]:
        return {"requested": self.requested, "revision": self.revision}


def requested_of(isvc: InferenceServiceSpec, annotations: Mapping[str, str]) -> str | None:
    """The key a pin is valid for; None when the model is not an `hf://` repo."""
    source = isvc.model.source
    if source.scheme != "hf":
        return None
    key = f"{source.repo}@{isvc.model.revision or DEFAULT_REVISION}"
    refresh = annotations.get(c.ANNOTATION_REFRESH_REVISION)
    return f"{key}#{refresh}" if refresh else key


def pinned(isvc: InferenceServiceSpec, pin: ModelPin | None) -> InferenceServiceSpec:
    """The spec whose download fetches the pinned commit."""
    if pin is None:
        return isvc
    return dataclasses.replace(isvc, model=dataclasses.replace(isvc.model, revision=pin.revision))


def recorded_pin(body: Mapping[str, Any]) -> ModelPin | None:
    model = (body.get("status") or {}).get("model") or {}
    if isinstance(model.get("requested"), str) and isinstance(model.get("revision"), str):
        return ModelPin(model["requested"], model["revision"])
    return None


async def pin_model(
    api: KubeApi,
    body: Mapping[str, Any],
    isvc: InferenceServiceSpec,
    *,
    default_endpoint: str,
    timeout: float,
) -> ModelPin | None:
    """The pin for this spec: the recorded one while it still applies, else a fresh
    resolution. Raises RevisionError."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    requested = requested_of(isvc, annotations)
    if requested is None:
        return None
    recorded = recorded_pin(body)
    if recorded is not None and recorded.requested == requested:
        return recorded
    revision = isvc.model.revision or DEFAULT_REVISION
    if COMMIT.match(revision):
        return ModelPin(requested, revision)
    endpoint = _env_value(isvc, "HF_ENDPOINT") or default_endpoint
    token = await _token(api, isvc)
    sha = await resolve(
        endpoint, str(isvc.model.source.repo), revision, token=token, timeout=timeout
    )
    return ModelPin(requested, sha)


async def resolve(
    endpoint: str, repo: str, revision: str, *, token: str | None, timeout: float
) -> str:
    """The commit `revision` names in `repo`, as the Hub API answers."""
    url = f"{endpoint.rstrip('/')}/api/models/{repo}/revision/{quote(revision, safe='')}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    where = f"{repo}@{revision} at {endpoint}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
            async with session.get(url, headers=headers) as response:
                text = await response.text()
                status = response.status
    except (aiohttp.ClientError, TimeoutError) as error:
        raise RevisionError(
            f"cannot reach the Hub to resolve {where}: {error or type(error).__name__}",
            transient=True,
        ) from error
    if status in (401, 403):
        raise RevisionError(
            f"the Hub refused {where} ({status}): a gated or private repository needs"
            " spec.model.tokenSecretRef with a token that may read it",
            transient=False,
        )
    if status == 404:
        raise RevisionError(f"no such repository or revision: {where}", transient=False)
    if status != 200:
        raise RevisionError(f"the Hub answered {status} for {where}", transient=status >= 500)
    try:
        sha = json.loads(text).get("sha")
    except (ValueError, AttributeError):
        sha = None
    if not isinstance(sha, str) or not COMMIT.match(sha):
        raise RevisionError(f"the Hub's answer for {where} has no commit sha", transient=False)
    return sha


async def _token(api: KubeApi, isvc: InferenceServiceSpec) -> str | None:
    ref = isvc.model.token_secret
    if ref is None:
        return None
    secret = await api.get(SECRETS, isvc.namespace, ref.name)
    if secret is None:
        raise RevisionError(
            f"spec.model.tokenSecretRef: Secret {ref.name} not found", transient=False
        )
    raw = (secret.get("data") or {}).get(ref.key)
    if not raw:
        raise RevisionError(
            f"spec.model.tokenSecretRef: Secret {ref.name} has no key {ref.key}", transient=False
        )
    return base64.b64decode(raw).decode().strip()


def _env_value(isvc: InferenceServiceSpec, name: str) -> str | None:
    for item in isvc.env:
        if item.get("name") == name and isinstance(item.get("value"), str):
            return str(item["value"])
    return None
