"""Validating objects like the API server would: built-in kinds against the Kubernetes
1.30 schemas, InferenceServices against the CRD (defaults, schema, list maps, CEL)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils

# kubernetes-validate re-reads its 1.3 MB definitions file on every call; the schema files
# never change, so cache them (a test-only speed-up: ~50 ms → ~25 ms per object).
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)
K8S_VERSION = "1.30"


def k8s_validate(obj: Mapping[str, Any]) -> None:
    """Validate a built-in object against the Kubernetes 1.30 schemas, strictly (no
    unknown fields); raises kubernetes_validate.ValidationError."""
    kubernetes_validate.validate(dict(obj), K8S_VERSION, strict=True)


class CrdValidator:
    """Defaulting, OpenAPI schema (strict fields), list-map keys and CEL rules of the CRD.

    The schema is OpenAPI v3.0 (boolean exclusiveMinimum), which JSON Schema draft 4
    understands; objects with fixed properties get `additionalProperties: false`, as
    `kubectl apply` (strict field validation) rejects unknown fields. CEL rules are
    evaluated with cel-python, plus the functions of Kubernetes' CEL string library that
    cel-python lacks (`split`).
    """

    def __init__(self, crd: Mapping[str, Any]) -> None:
        self.schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        self._validator = jsonschema.Draft4Validator(_strict(copy.deepcopy(self.schema)))

    def default(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        result = copy.deepcopy(dict(obj))
        _apply_defaults(self.schema, result)
        return result

    def schema_errors(self, obj: Mapping[str, Any]) -> list[str]:
        """Problems found by the OpenAPI schema alone (after defaulting)."""
        return [
            f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
            for error in self._validator.iter_errors(self.default(obj))
        ]

    def errors(self, obj: Mapping[str, Any]) -> list[str]:
        """Schema problems, or if there are none, list-map and CEL rule violations."""
        problems = self.schema_errors(obj)
        if problems:
            return problems  # CEL runs only on schema-valid objects, as in the API server
        _check_rules(self.schema, self.default(obj), "", problems)
        return problems


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    if (
        schema.get("type") == "object"
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        schema.setdefault("additionalProperties", False)
    for child in schema.get("properties", {}).values():
        _strict(child)
    if isinstance(schema.get("items"), dict):
        _strict(schema["items"])
    if isinstance(schema.get("additionalProperties"), dict):
        _strict(schema["additionalProperties"])
    return schema


def _apply_defaults(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
            if name in value:
                _apply_defaults(prop, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _apply_defaults(schema["items"], item)


def _split(text: Any, separator: Any) -> Any:
    """Kubernetes' CEL `string.split(separator)` (cel-go's strings extension)."""
    import celpy.celtypes as cel

    return cel.ListType([cel.StringType(part) for part in str(text).split(str(separator))])


K8S_CEL_FUNCTIONS = {"split": _split}


def _check_rules(schema: Mapping[str, Any], value: Any, path: str, problems: list[str]) -> None:
    import celpy

    for rule in schema.get("x-kubernetes-validations", []):
        env = celpy.Environment()
        program = env.program(env.compile(rule["rule"]), functions=K8S_CEL_FUNCTIONS)
        try:
            ok = program.evaluate({"self": celpy.json_to_cel(_typed(schema, value))})
        except celpy.CELEvalError as error:
            ok = False
            problems.append(
                f"{path or '<root>'}: rule {rule['rule']!r} failed to evaluate: {error}"
            )
        if not bool(ok):
            problems.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if schema.get("x-kubernetes-list-type") == "map" and isinstance(value, list):
        keys = [tuple(item.get(k) for k in schema["x-kubernetes-list-map-keys"]) for item in value]
        if len(keys) != len(set(keys)):
            problems.append(
                f"{path}: duplicate entries for map keys {schema['x-kubernetes-list-map-keys']}"
            )
    if isinstance(value, dict):
        for name, prop in schema.get("properties", {}).items():
            if name in value:
                _check_rules(prop, value[name], f"{path}.{name}" if path else name, problems)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            _check_rules(schema["items"], item, f"{path}[{index}]", problems)


def _typed(schema: Mapping[str, Any], value: Any) -> Any:
    """JSON → CEL types as Kubernetes does: `type: number` fields are doubles."""
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _typed(props.get(k, {}), v) for k, v in value.items()}
    if isinstance(value, list):
        items = schema.get("items", {}) if isinstance(schema.get("items"), dict) else {}
        return [_typed(items, v) for v in value]
    return value
