"""Typed reads out of an untrusted mapping, collecting every problem with its field path.

The CRD's schema and CEL rules reject bad specs at admission, but the operator must not
rely on that: an older API server may skip CEL, a CRD may be installed without
validation, and the test emulator validates nothing. `Reader` re-checks each rule and
reports all problems at once, so a user fixes a spec in one round.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

# Kubernetes naming rules (apimachinery validation)
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")  # a key without prefix
IMAGE = re.compile(r"^[^\s]{1,512}$")  # spec.image, spec.router.image


class SpecError(ValueError):
    """An InferenceService spec that can never work; `problems` lists each `path: reason`."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems))


class Reader:
    """Reads fields and records problems; call `raise_if_invalid()` when done."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def fail(self, path: str, message: str) -> None:
        self.problems.append(f"{path}: {message}")

    def raise_if_invalid(self) -> None:
        if self.problems:
            raise SpecError(self.problems)

    def known(self, value: Mapping[str, Any], fields: Sequence[str], path: str) -> None:
        """Flag fields the schema does not define (a typo would otherwise be ignored)."""
        unknown = sorted(set(value) - set(fields))
        if unknown:
            self.fail(path, f"unknown fields {unknown}")

    def mapping(self, parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        value = parent.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.fail(path, "must be an object")
            return {}
        return value

    def integer(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: int | None = None,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = parent.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(path, f"must be an integer, got {value!r}")
            return default
        if minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(path, f"must be <= {maximum}, got {value}")
        return value

    def number(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: float | None = None,
        exclusive_minimum: float | None = None,
        maximum: float | None = None,
        exclusive_maximum: float | None = None,
    ) -> float | None:
        value = parent.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(path, f"must be a number, got {value!r}")
            return default
        if exclusive_minimum is not None and value <= exclusive_minimum:
            self.fail(path, f"must be > {exclusive_minimum}, got {value}")
        if maximum is not None and value > maximum:
            self.fail(path, f"must be <= {maximum}, got {value}")
        if exclusive_maximum is not None and value >= exclusive_maximum:
            self.fail(path, f"must be < {exclusive_maximum}, got {value}")
        return float(value)

    def boolean(self, parent: Mapping[str, Any], key: str, path: str, *, default: bool) -> bool:
        value = parent.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(path, f"must be true or false, got {value!r}")
            return default
        return value

    def string(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        default: str | None = None,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        choices: Sequence[str] | None = None,
        max_length: int | None = None,
    ) -> str | None:
        value = parent.get(key)
        if value is None:
            if required:
                self.fail(path, "is required")
            return default
        if not isinstance(value, str):
            self.fail(path, f"must be a string, got {value!r}")
            return default
        if not value:
            self.fail(path, "must not be empty")
            return default
        if max_length is not None and len(value) > max_length:
            self.fail(path, f"must be at most {max_length} characters")
        if choices is not None and value not in choices:
            self.fail(path, f"must be one of {', '.join(choices)}; got {value!r}")
        if pattern is not None and not pattern.match(value):
            self.fail(path, f"{value!r} does not match {pattern.pattern}")
        return value

    def quantity(self, parent: Mapping[str, Any], key: str, path: str) -> str | None:
        """A resource quantity such as 4, "500m" or "16Gi"; returned as a string."""
        value = parent.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            self.fail(path, f"must be a quantity such as 2, 500m or 16Gi, got {value!r}")
            return None
        text = str(value)
        if not QUANTITY.match(text) or float(re.sub(r"[a-zA-Z]+$", "", text)) <= 0:
            self.fail(path, f"must be a positive quantity such as 2, 500m or 16Gi, got {value!r}")
            return None
        return text

    def objects(
        self, parent: Mapping[str, Any], key: str, path: str, *, max_items: int | None = None
    ) -> list[Mapping[str, Any]]:
        """A list of objects (absent → empty)."""
        value = parent.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, "must be a list")
            return []
        if max_items is not None and len(value) > max_items:
            self.fail(path, f"must have at most {max_items} items")
        items: list[Mapping[str, Any]] = []
        for index, item in enumerate(value):
            if isinstance(item, Mapping):
                items.append(item)
            else:
                self.fail(f"{path}[{index}]", "must be an object")
        return items

    def strings(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        max_items: int | None = None,
        max_length: int | None = None,
    ) -> list[str]:
        value = parent.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(path, "must be a list of strings")
            return []
        if max_items is not None and len(value) > max_items:
            self.fail(path, f"must have at most {max_items} items")
        items: list[str] = []
        for index, item in enumerate(value):
            if not isinstance(item, str) or not item:
                self.fail(f"{path}[{index}]", "must be a non-empty string")
            elif max_length is not None and len(item) > max_length:
                self.fail(f"{path}[{index}]", f"must be at most {max_length} characters")
            else:
                items.append(item)
        return items

    def string_map(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
        value = self.mapping(parent, key, path)
        result: dict[str, str] = {}
        for name, item in value.items():
            if not isinstance(item, str):
                self.fail(f"{path}.{name}", "must be a string")
            else:
                result[str(name)] = item
        return result


def check_label_key(r: Reader, key: str, path: str) -> None:
    """A label or annotation key: an optional DNS subdomain prefix and a name."""
    prefix, _, name = key.rpartition("/")
    if not name or len(name) > 63 or not LABEL_NAME.match(name):
        r.fail(path, f"{key!r} is not a valid key (name part: letters, digits, '-', '_', '.')")
    if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        r.fail(path, f"{key!r} has an invalid prefix (a DNS subdomain)")
