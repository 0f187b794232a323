"""One generic encoder/decoder for every message: dataclasses to msgpack and back.

A registered dataclass travels as `[type_name, [field values in declaration order]]`;
values may be plain msgpack types, lists, dicts or other registered dataclasses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import msgpack

_TAG = "__dc__"
_REGISTRY: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register(cls: T) -> T:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    if cls.__name__ in _REGISTRY and _REGISTRY[cls.__name__] is not cls:
        raise ValueError(f"two message types named {cls.__name__}")
    _REGISTRY[cls.__name__] = cls
    return cls


def _to_wire(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = type(obj).__name__
        if name not in _REGISTRY:
            raise TypeError(f"message type {name} is not registered")
        values = [_to_wire(getattr(obj, f.name)) for f in dataclasses.fields(obj)]
        return {_TAG: name, "v": values}
    if isinstance(obj, (list, tuple)):
        return [_to_wire(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_wire(v) for k, v in obj.items()}
    return obj


def _from_wire(obj: Any) -> Any:
    if isinstance(obj, dict):
        if _TAG in obj:
            cls = _REGISTRY[obj[_TAG]]
            values = [_from_wire(v) for v in obj["v"]]
            names = [f.name for f in dataclasses.fields(cls)]
            return cls(**dict(zip(names, values, strict=True)))
        return {k: _from_wire(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_wire(x) for x in obj]
    return obj


def encode(msg: Any) -> bytes:
    return msgpack.packb(_to_wire(msg), use_bin_type=True)


def decode(data: bytes) -> Any:
    return _from_wire(msgpack.unpackb(data, raw=False, strict_map_key=False))
