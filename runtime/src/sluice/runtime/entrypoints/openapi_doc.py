"""The server's OpenAPI document (`GET /openapi.json`), with every request body declared.

The generation routes read and validate their bodies themselves (to refuse unknown fields
by name, treat nulls as absent, and answer in OpenAI's error shape), so FastAPI cannot see
their models; each route names its model here and the document carries the models' JSON
schemas, as pydantic writes them, under `components.schemas`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from sluice.runtime.entrypoints.lora_api import LoadLoraAdapterRequest, UnloadLoraAdapterRequest
from sluice.runtime.entrypoints.openai_protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from sluice.runtime.entrypoints.responses_protocol import ResponsesRequest
from sluice.runtime.entrypoints.serving_tokenize import DetokenizeRequest, TokenizeRequest

OPENAPI_PATH = "/openapi.json"
REF = "#/components/schemas/{model}"

# route -> the model its JSON body must match
BODY_MODELS: dict[str, type[BaseModel]] = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/generate": GenerateRequest,
    "/v1/responses": ResponsesRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
    "/abort_request": AbortRequest,
    "/v1/load_lora_adapter": LoadLoraAdapterRequest,
    "/v1/unload_lora_adapter": UnloadLoraAdapterRequest,
}


def request_body(path: str) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads the body model of `path`."""
    ref = REF.format(model=BODY_MODELS[path].__name__)
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": ref}}},
        }
    }


# pydantic keeps a bound it could not attach to a validated type under its own name
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def _standard(node: Any) -> Any:
    """`node` with pydantic's leftover `ge`/`gt`/`le`/`lt` written as JSON Schema's bounds."""
    if isinstance(node, list):
        return [_standard(item) for item in node]
    if not isinstance(node, dict):
        return node
    typed = node.get("type") in ("integer", "number")
    return {
        (_BOUNDS[k] if typed and k in _BOUNDS else k): _standard(v) for k, v in node.items()
    }


def _prompt_rules(vocab_size: int | None) -> dict[str, Any]:
    """What `GenerateRequest.check` enforces in code, as JSON Schema: exactly one of `text`
    and `input_ids`, neither empty, token ids inside the model's vocabulary."""
    token: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size:
        token["maximum"] = vocab_size - 1
    ids = {"type": "array", "minItems": 1, "items": token}
    text = {"type": "string", "minLength": 1}
    return {
        "oneOf": [
            {
                "required": ["text"],
                "properties": {
                    "text": {"anyOf": [text, {"type": "array", "minItems": 1, "items": text}]},
                    "input_ids": {"type": "null"},
                },
            },
            {
                "required": ["input_ids"],
                "properties": {
                    "input_ids": {"anyOf": [ids, {"type": "array", "minItems": 1, "items": ids}]},
                    "text": {"type": "null"},
                },
            },
        ]
    }


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sluice")
    except Exception:  # running from a source tree that is not installed
        return "0"


def install(app: FastAPI, version: str | None = None, vocab_size: int | None = None) -> None:
    """Make `app.openapi()` (and so /openapi.json) include the body models (`vocab_size`:
    the model's, the bound of a token id)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=version or _version(), routes=app.routes)
            schemas = doc.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS.values():
                schema = _standard(model.model_json_schema(ref_template=REF))
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            schemas[GenerateRequest.__name__].update(_prompt_rules(vocab_size))
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
