"""`--lora-modules` entries and adapter names (no heavy imports: `ServerArgs` validates
with it)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$")


class LoraAdapterError(ValueError):
    """An adapter that cannot be served; the message names why."""


@dataclass(frozen=True)
class AdapterSpec:
    """One `--lora-modules` entry (vLLM's shape)."""

    name: str
    path: str
    base_model_name: str = ""


def parse_lora_module(value: str) -> AdapterSpec:
    """`NAME=PATH`, or the JSON form `{"name": ..., "path": ..., "base_model_name": ...}`."""
    value = value.strip()
    if value.startswith("{"):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--lora-modules {value!r}: invalid JSON ({exc.msg})") from exc
        if not isinstance(data, dict) or not {"name", "path"} <= data.keys():
            raise ValueError(f"--lora-modules {value!r}: the JSON form needs 'name' and 'path'")
        unknown = set(data) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"--lora-modules {value!r}: unknown keys {sorted(unknown)}")
        spec = AdapterSpec(
            str(data["name"]), str(data["path"]), str(data.get("base_model_name") or "")
        )
    else:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules {value!r}: expected NAME=PATH or a JSON object")
        spec = AdapterSpec(name.strip(), path.strip())
    check_name(spec.name)
    return spec


def parse_lora_modules(values: tuple[str, ...] | list[str]) -> list[AdapterSpec]:
    specs = [parse_lora_module(v) for v in values]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules: adapter names repeat: {sorted(names)}")
    return specs


def check_name(name: str) -> None:
    if not _NAME.match(name):
        raise LoraAdapterError(
            f"adapter name {name!r} must be 1-128 characters of letters, digits and ._/:- "
            "(starting with a letter or digit)"
        )
