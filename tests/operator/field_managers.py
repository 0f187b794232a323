"""Server-side apply's field ownership, as the API server keeps it (`metadata.managedFields`).

Pure functions over plain dicts, used by the API emulator. Modelled on
https://kubernetes.io/docs/reference/using-api/server-side-apply/:

- every field belongs to the managers that set it: an `Apply` by a field manager owns
  exactly the fields of the configuration it sent; an `Update` (merge or JSON patch, PUT,
  the scale subresource) makes its manager the only owner of the fields whose values it
  changed;
- an apply that changes a field someone else owns is a conflict (HTTP 409), unless forced,
  which moves the field to the applier; setting it to the value it already has shares it;
- a field the applier sent before and leaves out now is released: removed if nobody else
  owns it, kept if someone does; the API server then applies its defaults again (a
  Deployment without `spec.replicas` gets 1);
- a manager left owning nothing disappears from `managedFields`.

Simplification: lists are one field each (real SSA merges lists keyed by name, port...),
so a manager that edits one container owns the whole container list. Nothing the operator
relies on depends on finer list ownership.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str, ...]

# metadata the server owns; never part of anyone's fields
SERVER_METADATA = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "managedFields",
        "selfLink",
        "generateName",
    }
)

# (apiVersion, kind) → defaults the API server fills in when a field is absent
DEFAULTS: dict[tuple[str, str], tuple[tuple[Path, Any], ...]] = {
    ("apps/v1", "Deployment"): ((("spec", "replicas"), 1),),
}


@dataclass(frozen=True)
class Manager:
    name: str
    operation: str  # "Apply" | "Update"
    subresource: str = ""


@dataclass
class Ownership:
    """Who owns which fields of one object."""

    fields: dict[Manager, set[Path]] = field(default_factory=dict)

    def owners(self, path: Path, *, besides: Manager | None = None) -> list[Manager]:
        return [
            manager
            for manager, paths in self.fields.items()
            if manager != besides and any(overlap(path, p) for p in paths)
        ]

    def take(self, manager: Manager, paths: Iterable[Path]) -> None:
        """`manager` becomes the only owner of `paths`."""
        taken = set(paths)
        for other, owned in self.fields.items():
            if other != manager:
                owned -= {p for p in owned if any(overlap(p, t) for t in taken)}
        self.fields.setdefault(manager, set()).update(taken)
        self._prune()

    def drop(self, paths: Iterable[Path]) -> None:
        gone = set(paths)
        for owned in self.fields.values():
            owned -= {p for p in owned if any(overlap(p, g) for g in gone)}
        self._prune()

    def _prune(self) -> None:
        for manager in [m for m, owned in self.fields.items() if not owned]:
            del self.fields[manager]

    def managed_fields(self, api_version: str, now: str) -> list[dict[str, Any]]:
        entries = []
        for manager, paths in sorted(self.fields.items(), key=lambda item: item[0].name):
            entry: dict[str, Any] = {
                "manager": manager.name,
                "operation": manager.operation,
                "apiVersion": api_version,
                "time": now,
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(paths),
            }
            if manager.subresource:
                entry["subresource"] = manager.subresource
            entries.append(entry)
        return entries


class ApplyConflict(Exception):
    def __init__(self, conflicts: list[tuple[Manager, Path]]) -> None:
        self.conflicts = conflicts
        listed = "; ".join(f'conflict with "{m.name}": .{".".join(p)}' for m, p in conflicts)
        super().__init__(f"Apply failed with {len(conflicts)} conflict(s): {listed}")


def overlap(a: Path, b: Path) -> bool:
    return a[: len(b)] == b or b[: len(a)] == a


def leaves(obj: Mapping[str, Any], *, subresource: str = "") -> dict[Path, Any]:
    """Every field of `obj` a manager can own, with its value. `subresource` "status" keeps
    only status; "" keeps everything else."""
    result: dict[Path, Any] = {}

    def walk(value: Any, path: Path) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                walk(item, (*path, str(key)))
        else:
            result[path] = value

    for key, value in obj.items():
        if key in ("apiVersion", "kind"):
            continue
        if (key == "status") != (subresource == "status"):
            continue
        if key == "metadata" and isinstance(value, Mapping):
            for meta_key, meta_value in value.items():
                if meta_key not in SERVER_METADATA:
                    walk(meta_value, ("metadata", meta_key))
        else:
            walk(value, (key,))
    return result


def get(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, Mapping) or key not in obj:
            return _MISSING
        obj = obj[key]
    return obj


def put(obj: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        nxt = obj.get(key)
        if not isinstance(nxt, dict):
            nxt = obj[key] = {}
        obj = nxt
    obj[path[-1]] = copy.deepcopy(value)


def remove(obj: dict[str, Any], path: Path) -> None:
    """Delete the field, and the maps it leaves empty."""
    parents = []
    node: Any = obj
    for key in path[:-1]:
        if not isinstance(node, dict) or key not in node:
            return
        parents.append((node, key))
        node = node[key]
    if isinstance(node, dict):
        node.pop(path[-1], None)
    for parent, key in reversed(parents):
        if parent[key] == {}:
            del parent[key]
        else:
            break


def apply(
    current: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    ownership: Ownership,
    manager_name: str,
    *,
    force: bool,
) -> dict[str, Any]:
    """The object after `manager_name` applies `config` (ownership updated in place).
    Raises ApplyConflict. Status is not touched (it belongs to the status subresource)."""
    manager = Manager(manager_name, "Apply")
    base = copy.deepcopy(dict(current or {}))
    wanted = leaves(config)
    conflicts = [
        (other, path)
        for path, value in wanted.items()
        for other in ownership.owners(path, besides=manager)
        if get(base, path) != value
    ]
    if conflicts and not force:
        raise ApplyConflict(conflicts)
    before = ownership.fields.get(manager, set())
    released = {p for p in before if not any(overlap(p, w) for w in wanted)}
    result = base
    for path in released:
        if not ownership.owners(path, besides=manager):
            remove(result, path)
    for path, value in wanted.items():
        put(result, path, value)
    if force:
        ownership.take(manager, [p for _, p in conflicts])
    ownership.fields[manager] = set(wanted)
    ownership._prune()
    for key in ("apiVersion", "kind"):
        if key in config:
            result[key] = config[key]
    return apply_defaults(result)


def update(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    ownership: Ownership,
    manager_name: str,
    *,
    subresource: str = "",
) -> None:
    """Record a non-apply write: its manager owns what it changed; removed fields go."""
    scope = "status" if subresource == "status" else ""
    before, after = leaves(old, subresource=scope), leaves(new, subresource=scope)
    ownership.drop(path for path in before if path not in after)
    changed = [path for path, value in after.items() if before.get(path, _MISSING) != value]
    if changed:
        ownership.take(Manager(manager_name, "Update", subresource), changed)


def apply_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    for path, value in DEFAULTS.get((obj.get("apiVersion", ""), obj.get("kind", "")), ()):
        if get(obj, path) is _MISSING:
            put(obj, path, value)
    return obj


def fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    """The `fieldsV1` trie: {"f:spec": {"f:replicas": {}}}."""
    trie: dict[str, Any] = {}
    for path in sorted(paths):
        node = trie
        for key in path:
            node = node.setdefault(f"f:{key}", {})
    return trie


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
