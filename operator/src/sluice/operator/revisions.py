"""`hf://` models and LoRA adapters pinned to the commit they resolved to (as OME and
KServe do).

`spec.model.revision` may be a branch or tag (`main` when unset): what it names moves when
the repository gets a commit. Without a pin, a rollout, a rescheduled pod or a scale-up
would download whatever it names at that moment, and replicas of one service could serve
different weights. So the operator resolves it once, through the Hub API
(`GET {endpoint}/api/models/{repo}/revision/{revision}`, the `sha` of the answer), with the
token of `spec.model.tokenSecretRef` and the `HF_ENDPOINT` of `spec.env` (a mirror) when
given, and:

- records it in `status.model` (`revision`, and `requested`: what it resolved; each hf://
  adapter's under `adapters`, by name);
- puts the commit in the download containers (`SLUICE_MODEL_REVISION`, and each adapter's
  `revision` in the LoRA download's list), so every pod of the template fetches exactly
  that commit.

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
class Pin:
    requested: str  # "org/name@revision[#refresh]": what was resolved
    revision: str  # the commit

    def status(self) -> dict[str, str]:
        return {"requested": self.requested, "revision": self.revision}


@dataclass(frozen=True)
class ModelPin:
    """What status.model records: the model's pin (an hf:// model) and each hf:// LoRA
    adapter's, by adapter name."""

    model: Pin | None = None
    adapters: tuple[tuple[str, Pin], ...] = ()

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.model.status() if self.model else {}
        if self.adapters:
            status["adapters"] = [{"name": name, **pin.status()} for name, pin in self.adapters]
        return status


def _requested(repo: str, revision: str | None, refresh: str | None) -> str:
    key = f"{repo}@{revision or DEFAULT_REVISION}"
    return f"{key}#{refresh}" if refresh else key


def pinned(isvc: InferenceServiceSpec, pin: ModelPin | None) -> InferenceServiceSpec:
    """The spec whose downloads fetch the pinned commits."""
    if pin is None:
        return isvc
    model = isvc.model
    if pin.model is not None:
        model = dataclasses.replace(model, revision=pin.model.revision)
    commits = dict(pin.adapters)
    if model.lora is not None and commits:
        adapters = tuple(
            dataclasses.replace(a, revision=commits[a.name].revision) if a.name in commits else a
            for a in model.lora.adapters
        )
        model = dataclasses.replace(model, lora=dataclasses.replace(model.lora, adapters=adapters))
    return dataclasses.replace(isvc, model=model)


def recorded_pin(body: Mapping[str, Any]) -> ModelPin:
    recorded = (body.get("status") or {}).get("model") or {}

    def pin_of(item: Mapping[str, Any]) -> Pin | None:
        requested, revision = item.get("requested"), item.get("revision")
        ok = isinstance(requested, str) and isinstance(revision, str)
        return Pin(requested, revision) if ok else None  # type: ignore[arg-type]

    adapters = tuple(
        (str(item["name"]), pin)
        for item in recorded.get("adapters") or []
        if isinstance(item, Mapping) and (pin := pin_of(item)) is not None and item.get("name")
    )
    return ModelPin(pin_of(recorded), adapters)


async def pin_model(
    api: KubeApi,
    body: Mapping[str, Any],
    isvc: InferenceServiceSpec,
    *,
    default_endpoint: str,
    timeout: float,
) -> ModelPin | None:
    """The pins for this spec (None: nothing comes from the Hub): each recorded one while
    it still applies, the others resolved now. Raises RevisionError."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    refresh = annotations.get(c.ANNOTATION_REFRESH_REVISION)
    wanted: list[tuple[str | None, str, str | None]] = []  # (adapter name or None, repo, rev)
    if isvc.model.source.scheme == "hf":
        wanted.append((None, str(isvc.model.source.repo), isvc.model.revision))
    for adapter in isvc.model.lora.adapters if isvc.model.lora else ():
        if adapter.source.scheme == "hf":
            wanted.append((adapter.name, str(adapter.source.repo), adapter.revision))
    if not wanted:
        return None
    recorded = recorded_pin(body)
    before = {None: recorded.model, **dict(recorded.adapters)}
    endpoint = _env_value(isvc, "HF_ENDPOINT") or default_endpoint
    token: str | None = None
    token_read = False
    model: Pin | None = None
    adapters: list[tuple[str, Pin]] = []
    for name, repo, revision in wanted:
        requested = _requested(repo, revision, refresh)
        pin = before.get(name)
        if pin is None or pin.requested != requested:
            commit = revision or DEFAULT_REVISION
            if not COMMIT.match(commit):
                if not token_read:
                    token, token_read = await _token(api, isvc), True
                commit = await resolve(endpoint, repo, commit, token=token, timeout=timeout)
            pin = Pin(requested, commit)
        if name is None:
            model = pin
        else:
            adapters.append((name, pin))
    return ModelPin(model, tuple(adapters))


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
