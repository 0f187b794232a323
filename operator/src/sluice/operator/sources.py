"""Model sources (`bundled://`, `hf://`, `pvc://`) and Secret references, read from a spec."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sluice.runtime import constants as rc

from . import constants as c
from .spec import LoraAdapterSpec, LoraSpec, ModelSource, ModelSpec, SecretKeyRef
from .validation import DNS1123_LABEL, DNS1123_SUBDOMAIN, SECRET_KEY, Reader

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
        ("source", "revision", "servedName", "tokenSecretRef", "storageSize", "files", "cache",
         "lora"),
        "spec.model",
    )  # fmt: skip
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
        lora=read_lora(r, model),
    )


def read_lora(r: Reader, model: Mapping[str, Any]) -> LoraSpec | None:
    """`spec.model.lora`: adapter names are DNS labels (they become folder names and the
    `model` clients send) and unique; sources are hf:// or pvc:// (no adapter is bundled)."""
    if model.get("lora") is None:
        return None
    path = "spec.model.lora"
    lora = r.mapping(model, "lora", path)
    r.known(lora, ("adapters", "maxAdapters", "maxRank"), path)
    items = r.objects(lora, "adapters", f"{path}.adapters", max_items=c.MAX_LORA_ADAPTERS)
    if not items:
        r.fail(f"{path}.adapters", "must list at least one adapter")
    adapters: list[LoraAdapterSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        at = f"{path}.adapters[{i}]"
        r.known(item, ("name", "source", "revision"), at)
        name = r.string(item, "name", f"{at}.name", required=True, pattern=DNS1123_LABEL, max_length=63)
        uri = r.string(item, "source", f"{at}.source", required=True, max_length=512)
        revision = r.string(item, "revision", f"{at}.revision", pattern=REVISION)
        source = _model_source(r, uri, f"{at}.source") if uri else None
        if source is not None and source.scheme == "bundled":
            r.fail(f"{at}.source", "no LoRA adapter is bundled: use hf://ORG/NAME or pvc://CLAIM/PATH")
            source = None
        if source is not None and source.scheme != "hf" and revision is not None:
            r.fail(f"{at}.revision", "is only valid for hf:// sources")
        if name is not None and name in seen:
            r.fail(f"{at}.name", f"{name!r} is listed twice")
        if name is not None and source is not None:
            seen.add(name)
            adapters.append(LoraAdapterSpec(name, source, revision))
    max_adapters = r.integer(lora, "maxAdapters", f"{path}.maxAdapters", minimum=1, maximum=c.MAX_LORA_ADAPTERS)
    max_rank = r.integer(lora, "maxRank", f"{path}.maxRank", minimum=1, maximum=512)
    return LoraSpec(tuple(adapters), max_adapters, max_rank)


def _model_source(r: Reader, uri: str, path: str = "spec.model.source") -> ModelSource | None:
    if uri.startswith("bundled://") and uri.removeprefix("bundled://") in rc.BUNDLED_MODELS:
        return ModelSource(uri=uri, scheme="bundled", path=uri.removeprefix("bundled://"))
    if match := HF_SOURCE.match(uri):
        return ModelSource(uri=uri, scheme="hf", repo=f"{match['org']}/{match['name']}")
    if match := PVC_SOURCE.match(uri):
        if len(match["claim"]) > 253:
            r.fail(path, "claim name is longer than 253 characters")
        return ModelSource(
            uri=uri, scheme="pvc", claim=match["claim"], path=match["path"].strip("/")
        )
    r.fail(
        path,
        f"must be {rc.BUNDLED_MODEL_URI}, {rc.BUNDLED_GEMMA3_URI}, hf://ORG/NAME or "
        f"pvc://CLAIM/PATH, got {uri!r}",
    )
    return None
