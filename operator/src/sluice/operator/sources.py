"""Model sources (`bundled://`, `hf://`, `pvc://`) and Secret references, read from a spec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .spec import ModelSource, ModelSpec, SecretKeyRef
from .validation import DNS1123_SUBDOMAIN, SECRET_KEY, Reader

HF_REPO_PART = r"[A-Za-z0-9][-A-Za-z0-9_.]{0,95}"
PATH_SEGMENT = r"[A-Za-z0-9_][-A-Za-z0-9_.+@=]*"
HF_SOURCE = re.compile(rf"^hf://(?P<org>{HF_REPO_PART})/(?P<name>{HF_REPO_PART})$")
PVC_SOURCE = re.compile(
    rf"^pvc://(?P<claim>[a-z0-9]([-a-z0-9]*[a-z0-9])?)(?P<path>(/{PATH_SEGMENT})*)/?$"
)
REVISION = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./]{0,127}$")
SERVED_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_./:]{0,255}$")


def read_secret_ref(
    r: Reader, parent: Mapping[str, Any], key: str, path: str, default_key: str
) -> SecretKeyRef | None:
    if parent.get(key) is None:
        return None
    ref = r.mapping(parent, key, path)
    r.known(ref, ("name", "key"), path)
    name = r.string(
        ref, "name", f"{path}.name", required=True, pattern=DNS1123_SUBDOMAIN, max_length=253
    )
    secret_key = r.string(
        ref, "key", f"{path}.key", default=default_key, pattern=SECRET_KEY, max_length=253
    )
    if name is None or secret_key is None:
        return None
    return SecretKeyRef(name=name, key=secret_key)


def read_model(r: Reader, spec: Mapping[str, Any]) -> ModelSpec | None:
    if spec.get("model") is None:
        r.fail("spec.model", "is required")
        return None
    model = r.mapping(spec, "model", "spec.model")
    r.known(
        model,
        ("source", "revision", "servedName", "tokenSecretRef", "storageSize", "files", "cache"),
        "spec.model",
    )
    uri = r.string(model, "source", "spec.model.source", required=True, max_length=512)
    source = _model_source(r, uri) if uri else None
    revision = r.string(model, "revision", "spec.model.revision", pattern=REVISION)
    served = r.string(model, "servedName", "spec.model.servedName", pattern=SERVED_NAME)
    token = read_secret_ref(
        r, model, "tokenSecretRef", "spec.model.tokenSecretRef", c.DEFAULT_HF_TOKEN_KEY
    )
    storage = r.quantity(model, "storageSize", "spec.model.storageSize")
    files = r.strings(model, "files", "spec.model.files", max_items=64, max_length=256)
    for index, pattern in enumerate(files):
        if pattern.startswith("/") or ".." in pattern.split("/"):
            r.fail(f"spec.model.files[{index}]", f"{pattern!r} must be a path inside the repo")
    cache = r.mapping(model, "cache", "spec.model.cache")
    r.known(cache, ("claimName",), "spec.model.cache")
    claim = r.string(
        cache,
        "claimName",
        "spec.model.cache.claimName",
        required=model.get("cache") is not None,
        pattern=DNS1123_SUBDOMAIN,
        max_length=253,
    )
    if source is None:
        return None
    if source.scheme != "hf":
        for key, value in (
            ("revision", revision),
            ("tokenSecretRef", token),
            ("storageSize", storage),
            ("files", files or None),
            ("cache", claim),
        ):
            if value is not None:
                r.fail(f"spec.model.{key}", "is only valid for hf:// sources")
    return ModelSpec(
        source=source,
        served_name=served or source.default_served_name,
        revision=revision,
        token_secret=token,
        storage_size=storage,
        files=tuple(files),
        cache_claim=claim,
    )


def _model_source(r: Reader, uri: str) -> ModelSource | None:
    if uri.startswith("bundled://") and uri.removeprefix("bundled://") in rc.BUNDLED_MODELS:
        return ModelSource(uri=uri, scheme="bundled", path=uri.removeprefix("bundled://"))
    if match := HF_SOURCE.match(uri):
        return ModelSource(uri=uri, scheme="hf", repo=f"{match['org']}/{match['name']}")
    if match := PVC_SOURCE.match(uri):
        if len(match["claim"]) > 253:
            r.fail("spec.model.source", "claim name is longer than 253 characters")
        return ModelSource(
            uri=uri, scheme="pvc", claim=match["claim"], path=match["path"].strip("/")
        )
    r.fail(
        "spec.model.source",
        f"must be {rc.BUNDLED_MODEL_URI}, {rc.BUNDLED_GEMMA3_URI}, hf://ORG/NAME or "
        f"pvc://CLAIM/PATH, got {uri!r}",
    )
    return None
