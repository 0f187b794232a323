"""Server-side apply's field ownership, as the API server keeps it (`metadata.managedFields`).

Pure functions over plain dicts, used by the API emulator: a port of what the API server
runs, structured-merge-diff v6 (sigs.k8s.io/structured-merge-diff, `merge/update.go` and
`typed/{merge,compare,remove,tofieldset}.go`) under k8s.io/apimachinery's field manager
(`pkg/util/managedfields/internal`), typed by the Kubernetes OpenAPI schema:

- a field path is a tuple of the elements `metadata.managedFields` writes: `f:name` for a
  field, `k:{"name":"runtime"}` for an item of a list-map (`x-kubernetes-list-type: map`,
  by its `x-kubernetes-list-map-keys`: containers and env by name, ports by
  containerPort+protocol, volumeMounts by mountPath...), `v:"x"` for an item of a set;
  atomic lists and atomic maps (a label selector, `nodeSelector`, `args`) are one field;
- an `Apply` owns exactly the fields of the configuration it sent, item by item: two
  managers that set different containers or env vars share the list; an `Update` (merge or
  JSON patch, PUT, the scale subresource) owns what it changed or added, and takes it from
  the others;
- an apply that changes or adds a field someone else owns (a list item's field, not the
  list) is a conflict (HTTP 409, the API server's message), unless forced, which takes the
  field from them; setting it to the value it already has shares it;
- what the applier sent before and leaves out now is released: removed if nobody else owns
  it (a list item goes when nobody else owns the item itself), kept if someone does; the
  API server then applies its defaults again (a Deployment without `spec.replicas` gets 1);
- a manager left owning nothing disappears from `managedFields`; apiVersion, kind and the
  server's metadata (name, uid...) are nobody's (the field manager's stripMeta).

The schema: kubernetes-validate's copy of the Kubernetes OpenAPI (`_definitions.json` of
the version the cluster tier runs, 1.36), read as kube-openapi's schemaconv reads it:
`x-kubernetes-list-type`/`-list-map-keys`, else `x-kubernetes-patch-strategy: merge` with
its `patch-merge-key` (a list-map; without a key, a set), else atomic;
`x-kubernetes-map-type: atomic`. That copy is the OpenAPI v2, which has no `default`s: the
defaults of list-map key fields (`+default` in k8s.io/api) are in KEY_DEFAULTS. Custom
resources use their CRD's schema (`register_crd`) with ObjectMeta's for metadata; a kind
with no schema (PodMonitor, InferencePool here) is typed as structured-merge-diff types
the unknown: maps field by field, lists atomic, which is what their CRDs declare.

Checked against a real kube-apiserver by tests/cluster/test_cluster_ssa_listmaps.py.

Not emulated: on create, the API server's empty object has Go's non-pointer structs, so an
`Update` creating a Deployment does not own `f:spec` itself (here it does; owning a struct
itself changes nothing: a named field is kept while anyone owns a field under it); items
with duplicate keys and applied `null` values are handled only roughly. The CRD schemas
are process-wide (the last CRD created for a kind types it, as on a real server).
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str, ...]  # path elements as fieldsV1 writes them: "f:spec", 'k:{"name":"a"}'

# metadata the server owns: no manager owns it, and an apply neither sends nor removes it
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

# apimachinery's stripMetaManager: removed from the writing manager's fields after each write
STRIPPED: frozenset[Path] = frozenset(
    {("f:apiVersion",), ("f:kind",), ("f:metadata",)}
    | {
        ("f:metadata", f"f:{name}")
        for name in (
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        )
    }
)

# (apiVersion, kind) → defaults the API server fills in when a field is absent
DEFAULTS: dict[tuple[str, str], tuple[tuple[tuple[str, ...], Any], ...]] = {
    ("apps/v1", "Deployment"): ((("spec", "replicas"), 1),),
}

# defaults of list-map key fields: `+default` markers in k8s.io/api core/v1 types.go (v0.36),
# which the API server's OpenAPI v3 carries and kubernetes-validate's v2 copy does not; a
# port without `protocol` is the item k:{"containerPort":8080,"protocol":"TCP"}
KEY_DEFAULTS: dict[str, dict[str, Any]] = {
    "io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.ServicePort": {"protocol": "TCP"},
    "io.k8s.api.core.v1.LocalObjectReference": {"name": ""},
}

SCHEMA_VERSION = "1.36.0"  # kubernetes-validate's schemas closest to the tier's v1.36.3


# -- the schema ---------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
MAP, LIST, SCALAR, ANY = "map", "list", "scalar", "any"
_SCALAR_TYPES = frozenset({"string", "integer", "number", "boolean"})


class Type:
    """One node of an OpenAPI schema as structured-merge-diff types it."""

    def __init__(
        self,
        node: Mapping[str, Any],
        defs: Mapping[str, Any],
        overrides: Mapping[str, Type] | None = None,
    ) -> None:
        self.name = ""
        while True:  # follow $ref (and a lone allOf), keeping the definition's name
            if "$ref" in node:
                self.name = node["$ref"].rsplit("/", 1)[-1]
                node = defs[self.name]
            elif len(node.get("allOf") or ()) == 1 and not node.get("properties"):
                node = node["allOf"][0]
            else:
                break
        self.node, self.defs, self.overrides = node, defs, dict(overrides or {})
        self.form = _form(node) if not self.overrides else MAP
        self.properties: Mapping[str, Any] = node.get("properties") or {}
        extra = node.get("additionalProperties")
        self._element = extra if isinstance(extra, Mapping) else None
        self.map_atomic = self.form == MAP and node.get("x-kubernetes-map-type") == "atomic"
        self.keys: tuple[str, ...] | None = None  # a list-map's keys; () for a set
        self.list_atomic = self.form != LIST or _list_relationship(node, self)
        self._children: dict[str, Type] = {}

    def field(self, name: str) -> Type:
        if name in self.overrides:
            return self.overrides[name]
        found = self._children.get(name)
        if found is None:
            if name in self.properties:
                found = Type(self.properties[name], self.defs)
            elif self._element is not None:
                found = Type(self._element, self.defs)
            else:
                found = UNTYPED
            self._children[name] = found
        return found

    def declared(self, name: str) -> bool:
        """A named field of a struct (a map's keys are not)."""
        return self.form == MAP and (name in self.properties or name in self.overrides)

    @functools.cached_property
    def items(self) -> Type:
        node = self.node.get("items")
        return Type(node, self.defs) if isinstance(node, Mapping) else UNTYPED

    def element(self, item: Any) -> str:
        """The path element of a list item: its key (list-map) or its value (set)."""
        if self.keys and isinstance(item, Mapping):
            key = {}
            for name in self.keys:
                if name in item:
                    key[name] = item[name]
                elif self._key_defaults.get(name) is not None:
                    key[name] = self._key_defaults[name]
            return "k:" + _json(dict(sorted(key.items())))
        return "v:" + _json(item)

    @functools.cached_property
    def _key_defaults(self) -> dict[str, Any]:
        """getAssociativeKeyDefault: a key field an item leaves out has its default."""
        declared = {
            k: v["default"]
            for k, v in self.items.properties.items()
            if isinstance(v, Mapping) and "default" in v
        }
        return {**KEY_DEFAULTS.get(self.items.name, {}), **declared}


def _form(node: Mapping[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return SCALAR
    raw = node.get("type")
    types = {raw} if isinstance(raw, str) else set(raw or ())
    types.discard("null")
    if "properties" in node or "additionalProperties" in node or "object" in types:
        return MAP
    if "items" in node or "array" in types:
        return LIST
    if types & _SCALAR_TYPES:
        return SCALAR
    options = node.get("oneOf") or node.get("anyOf") or ()
    if options and all(_form(option) == SCALAR for option in options):
        return SCALAR  # IntOrString, Quantity
    return ANY


def _list_relationship(node: Mapping[str, Any], t: Type) -> bool:
    """kube-openapi schemaconv's getListElementRelationship; True if atomic (sets `keys`)."""
    list_type = node.get("x-kubernetes-list-type")
    if list_type == "atomic":
        return True
    if list_type == "set":
        t.keys = ()
        return False
    if list_type == "map":
        t.keys = tuple(node.get("x-kubernetes-list-map-keys") or ())
        return False
    if node.get("x-kubernetes-patch-strategy") in ("merge", "merge,retainKeys"):
        key = node.get("x-kubernetes-patch-merge-key")
        t.keys = (key,) if key else ()
        return False
    return True


class _Untyped(Type):
    """structured-merge-diff's deduced type: maps field by field, lists atomic."""

    def __init__(self) -> None:
        super().__init__({}, {})

    def field(self, name: str) -> Type:
        return self

    @property
    def items(self) -> Type:  # type: ignore[override]
        return self


UNTYPED = _Untyped()
_CRDS: dict[tuple[str, str], Mapping[str, Any]] = {}


@functools.cache
def _definitions() -> dict[str, Any]:
    import kubernetes_validate

    base = pathlib.Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    wanted = base / f"v{SCHEMA_VERSION}-local"
    if not wanted.exists():  # another kubernetes-validate: its newest schemas
        versions = [p for p in base.glob("v*-local") if p.name.count(".") == 2]
        wanted = max(versions, key=lambda p: tuple(int(x) for x in p.name[1:-6].split(".")))
    definitions: dict[str, Any] = json.loads((wanted / "_definitions.json").read_text())["$defs"]
    return definitions


@functools.cache
def _kinds() -> dict[tuple[str, str], str]:
    found = {}
    for name, node in _definitions().items():
        for gvk in node.get("x-kubernetes-group-version-kind") or ():
            api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
            found[(api_version, gvk["kind"])] = name
    return found


def register_crd(crd: Mapping[str, Any]) -> None:
    """Type the custom resources of `crd` by its schema, as the API server does."""
    spec = crd.get("spec") or {}
    for version in spec.get("versions") or ():
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if schema:
            api_version = f"{spec['group']}/{version['name']}"
            _CRDS[(api_version, spec["names"]["kind"])] = schema
            _type_of.cache_clear()


@functools.cache
def _type_of(api_version: str, kind: str) -> Type:
    defs = _definitions()
    meta = Type({"$ref": "#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}, defs)
    if (api_version, kind) in _CRDS:
        return Type(_CRDS[(api_version, kind)], defs, overrides={"metadata": meta})
    name = _kinds().get((api_version, kind))
    if name is not None:
        return Type({"$ref": f"#/$defs/{name}"}, defs)
    return Type({"x-kubernetes-preserve-unknown-fields": True}, defs, {"metadata": meta})


def type_of(obj: Mapping[str, Any]) -> Type:
    return _type_of(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))


def _shape(t: Type, value: Any) -> str:
    if isinstance(value, Mapping):
        return MAP if t.form in (MAP, ANY) else SCALAR
    if isinstance(value, list):
        return LIST if t.form in (LIST, ANY) else SCALAR
    return SCALAR


def _json(value: Any) -> str:
    """JSON as Go's encoding/json writes it (HTML characters escaped)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text


def _same(a: Any, b: Any) -> bool:
    """structured-merge-diff's value equality (1 == 1.0, True != 1)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return (
        type(a) is type(b)
        and a == b
        or (isinstance(a, (int, float)) and isinstance(b, (int, float)) and a == b)
    )


# -- the typed operations (structured-merge-diff's walkers) --------------------------------


def field_set(value: Mapping[str, Any], t: Type) -> set[Path]:
    """typed.ToFieldSet: the fields an applied configuration owns."""
    out: set[Path] = set()
    _to_set(value, t, (), out)
    return out


def _to_set(value: Any, t: Type, path: Path, out: set[Path]) -> None:
    shape = _shape(t, value)
    if shape == SCALAR:
        out.add(path)
    elif shape == LIST:
        if t.list_atomic:
            out.add(path)
            return
        elements = [t.element(item) for item in value]
        for item, pe in zip(value, elements, strict=True):
            child = (*path, pe)
            if elements.count(pe) == 1:
                _to_set(item, t.items, child, out)
            out.add(child)
    elif t.map_atomic:
        out.add(path)
    else:
        for key, item in value.items():
            child = (*path, f"f:{key}")
            _to_set(item, t.field(key), child, out)
            if item is None or item == {} or not t.declared(key):
                out.add(child)


def merge(lhs: Any, rhs: Any, t: Type) -> Any:
    """typed.Merge (the live object, then the configuration over it)."""
    if rhs is _MISSING:
        return lhs
    if lhs is _MISSING:
        return rhs
    shape = _shape(t, rhs)
    if shape != _shape(t, lhs) or shape == SCALAR:
        return rhs
    if shape == LIST:
        if t.list_atomic or (not lhs and not rhs):
            return rhs
        return _merge_list(lhs, rhs, t)
    if t.map_atomic or (not lhs and not rhs):
        return rhs
    out = {}
    for key in [*lhs, *(k for k in rhs if k not in lhs)]:
        merged = merge(lhs.get(key, _MISSING), rhs.get(key, _MISSING), t.field(key))
        if merged is not _MISSING:
            out[key] = merged
    return out


def _merge_list(lhs: list[Any], rhs: list[Any], t: Type) -> Any:
    """mergingWalker.visitListItems: the live order, with the applied items in the
    applied order where they are shared and new ones after their predecessors."""
    rhs_pes = [t.element(item) for item in rhs]
    observed_rhs = dict(zip(rhs_pes, rhs, strict=True))
    lhs_pes: list[str] = []
    observed_lhs: dict[str, Any] = {}
    for item in lhs:
        pe = t.element(item)
        observed_lhs[pe] = None if pe in observed_lhs else item  # duplicates: null
        lhs_pes.append(pe)
    shared = [pe for pe in rhs_pes if pe in observed_lhs]
    next_shared = shared.pop(0) if shared else None
    merged_rhs: set[str] = set()
    out: list[Any] = []
    li = ri = 0
    while li < len(lhs_pes) or ri < len(rhs_pes):
        if li < len(lhs_pes) and ri < len(rhs_pes):
            pe = lhs_pes[li]
            if pe == rhs_pes[ri]:
                merged_rhs.add(pe)
                out.append(merge(observed_lhs[pe], observed_rhs[pe], t.items))
                li, ri = li + 1, ri + 1
                next_shared = shared.pop(0) if shared else None
                continue
            if pe in observed_rhs and next_shared is not None and next_shared != pe:
                li += 1
                continue
        if li < len(lhs_pes):
            pe = lhs_pes[li]
            if pe not in observed_rhs:
                out.append(lhs[li])
                li += 1
                continue
            if pe in merged_rhs:
                li += 1
        if ri < len(rhs_pes):
            pe = rhs_pes[ri]
            merged_rhs.add(pe)
            out.append(merge(observed_lhs.get(pe, _MISSING), observed_rhs[pe], t.items))
            ri += 1
            if next_shared is not None and next_shared == pe:
                next_shared = shared.pop(0) if shared else None
    return out if out else _MISSING


@dataclass
class Comparison:
    added: set[Path] = field(default_factory=set)
    modified: set[Path] = field(default_factory=set)
    removed: set[Path] = field(default_factory=set)

    def excluding(self, keep: Any) -> Comparison:
        return Comparison(*({p for p in s if keep(p)} for s in
                            (self.added, self.modified, self.removed)))  # fmt: skip


def compare(lhs: Any, rhs: Any, t: Type) -> Comparison:
    """typed.Compare: which fields `rhs` added, modified and removed."""
    result = Comparison()
    _compare(lhs, rhs, t, (), result)
    return result


def _compare(lhs: Any, rhs: Any, t: Type, path: Path, c: Comparison) -> None:
    present = rhs if rhs is not _MISSING else lhs
    shape = _shape(t, present)
    if lhs is not _MISSING and rhs is not _MISSING and _shape(t, lhs) != shape:
        c.modified.add(path)
        return
    leaf = shape == SCALAR
    if shape == LIST:
        left = lhs if isinstance(lhs, list) else []
        right = rhs if isinstance(rhs, list) else []
        leaf = t.list_atomic or (not left and not right)
        if not leaf:
            _compare_list(left, right, t, path, c)
    elif shape == MAP:
        left = lhs if isinstance(lhs, Mapping) else {}
        right = rhs if isinstance(rhs, Mapping) else {}
        leaf = t.map_atomic or (not left and not right)
        if not leaf:
            for key in [*left, *(k for k in right if k not in left)]:
                _compare(left.get(key, _MISSING), right.get(key, _MISSING), t.field(key),
                         (*path, f"f:{key}"), c)  # fmt: skip
    if lhs is _MISSING:
        c.added.add(path)
    elif rhs is _MISSING:
        c.removed.add(path)
    elif leaf and not _same(lhs, rhs):
        c.modified.add(path)


def _compare_list(lhs: list[Any], rhs: list[Any], t: Type, path: Path, c: Comparison) -> None:
    left: dict[str, list[Any]] = {}
    right: dict[str, list[Any]] = {}
    for side, items in ((left, lhs), (right, rhs)):
        for item in items:
            side.setdefault(t.element(item), []).append(item)
    for pe in [*left, *(pe for pe in right if pe not in left)]:
        ls, rs, child = left.get(pe, []), right.get(pe, []), (*path, pe)
        if len(ls) <= 1 and len(rs) <= 1:
            _compare(ls[0] if ls else _MISSING, rs[0] if rs else _MISSING, t.items, child, c)
        elif len(ls) >= 2 and len(rs) >= 2:
            if not _same(ls, rs):
                c.modified.add(child)
        elif len(ls) >= 2:
            if rs:
                _compare(_MISSING, rs[0], t.items, child, c)
            c.removed.add(child)
        else:
            if ls:
                _compare(ls[0], _MISSING, t.items, child, c)
            c.added.add(child)


class _Trie(dict[str, "_Trie"]):
    member = False


def _trie(paths: Iterable[Path]) -> _Trie:
    root = _Trie()
    for path in paths:
        node = root
        for pe in path:
            node = node.setdefault(pe, _Trie())
        node.member = True
    return root


def remove_items(value: Any, paths: Iterable[Path], t: Type) -> Any:
    """typed.RemoveItems: `value` without the fields `paths` (a field's subtree goes
    with it; a map or list left empty goes too)."""
    trie = _trie(paths)
    if not trie:
        return value
    result = _remove(value, trie, t)
    return {} if result is _MISSING else result


def _remove(value: Any, trie: _Trie, t: Type) -> Any:
    shape = _shape(t, value)
    if shape == SCALAR:
        return value
    if shape == LIST:
        if not value or t.list_atomic:
            return _MISSING
        items = []
        for item in value:
            node = trie.get(t.element(item))
            if node is not None and node.member:
                continue
            if node:
                item = _remove(item, node, t.items)
                if item is _MISSING:
                    continue
            items.append(item)
        return items if items else _MISSING
    if not value or t.map_atomic:
        return _MISSING
    out = {}
    for key, item in value.items():
        node = trie.get(f"f:{key}")
        if node is not None and node.member:
            continue
        if node:
            item = _remove(item, node, t.field(key))
            if item is _MISSING:
                continue
        out[key] = item
    return out if out else _MISSING


def with_named_fields(paths: Iterable[Path], t: Type) -> set[Path]:
    """Set.EnsureNamedFieldsAreMembers: the paths, and the named (struct) fields above
    them (not a map's keys, not list items)."""
    out = set(paths)
    for path in list(out):
        node = t
        for i, pe in enumerate(path[:-1]):
            if pe.startswith("f:"):
                name = pe[2:]
                if node.declared(name):
                    out.add(path[: i + 1])
                node = node.field(name) if node.form in (MAP, ANY) else UNTYPED
            else:
                node = node.items if node.form in (LIST, ANY) else UNTYPED
    return out


# -- managers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Manager:
    name: str
    operation: str  # "Apply" | "Update"
    subresource: str = ""

    def describe(self, api_version: str) -> str:
        """As the API server names it in a conflict (internal/conflict.go printManager)."""
        text = json.dumps(self.name)
        if self.subresource:
            text += f" with subresource {json.dumps(self.subresource)}"
        if self.operation == "Update":
            text += f" using {api_version}"
        return text


@dataclass
class Ownership:
    """Who owns which fields of one object."""

    fields: dict[Manager, set[Path]] = field(default_factory=dict)

    def owners(self, path: Path, *, besides: Manager | None = None) -> list[Manager]:
        """The managers that own the field `path` (see `path()`) itself."""
        return [m for m, owned in self.fields.items() if m != besides and path in owned]

    def managed_fields(self, api_version: str, now: str) -> list[dict[str, Any]]:
        entries = []
        for manager, paths in sorted(
            self.fields.items(), key=lambda i: (i[0].operation, i[0].name, i[0].subresource)
        ):
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
    def __init__(self, conflicts: list[tuple[Manager, Path]], api_version: str = "") -> None:
        self.conflicts = conflicts
        if len(conflicts) == 1:
            manager, path = conflicts[0]
            message = (
                f"Apply failed with 1 conflict: conflict with"
                f" {manager.describe(api_version)}: {path_string(path)}"
            )
        else:
            lines = []
            for manager in sorted({m for m, _ in conflicts}, key=lambda m: m.name):
                lines.append(f"conflicts with {manager.describe(api_version)}:")
                lines += [f"- {path_string(p)}" for m, p in conflicts if m == manager]
            message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
        super().__init__(message)


def path(*parts: str | Mapping[str, Any]) -> Path:
    """A field path from names and list-map keys: path("spec", "containers", {"name": "a"})."""
    return tuple(
        f"f:{p}" if isinstance(p, str) else "k:" + _json(dict(sorted(p.items()))) for p in parts
    )


def path_string(path: Path) -> str:
    """As structured-merge-diff prints a path: .spec.containers[name="a"].image"""
    text = ""
    for pe in path:
        kind, rest = pe[0], pe[2:]
        if kind == "f":
            text += f".{rest}"
        elif kind == "k":
            key = json.loads(rest)
            text += "[" + ",".join(f"{k}={_go_string(v)}" for k, v in key.items()) + "]"
        else:
            text += f"[={_go_string(json.loads(rest))}]"
    return text


def _go_string(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else _json(value)


def fields_v1(paths: Iterable[Path]) -> dict[str, Any]:
    """The `fieldsV1` trie: {"f:spec": {"f:replicas": {}}}; "." marks a field owned itself
    that has owned fields under it (a list item and its fields)."""
    trie: dict[str, Any] = {}
    for p in sorted(paths):
        node = trie
        for pe in p:
            node = node.setdefault(pe, {})
        if p:
            node["."] = {}
    return _dots(trie)


def _dots(node: dict[str, Any]) -> dict[str, Any]:
    children = {k: _dots(v) for k, v in node.items() if k != "."}
    if "." in node and children:
        return {".": {}, **children}
    return children


def parse_fields_v1(trie: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The paths of a `fieldsV1` trie (the inverse of `fields_v1`)."""
    out: set[Path] = set()
    for key, child in trie.items():
        if key == ".":
            out.add(prefix)
        elif child:
            out |= parse_fields_v1(child, (*prefix, key))
        else:
            out.add((*prefix, key))
    return out


# -- the writes -----------------------------------------------------------------------------


def _split_server_metadata(obj: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the object without the server's metadata, that metadata)."""
    body = json.loads(json.dumps(dict(obj or {})))
    meta = body.get("metadata")
    server: dict[str, Any] = {}
    if isinstance(meta, dict):
        server = {k: meta.pop(k) for k in list(meta) if k in SERVER_METADATA}
        if not meta:
            del body["metadata"]
    return body, server


def _scope(subresource: str) -> Any:
    """The reset fields of the write's strategy: status is the status subresource's, the
    rest the object's."""
    if subresource == "status":
        return lambda p: p[:1] != ("f:spec",)
    return lambda p: p[:1] != ("f:status",)


def _settle(managers: dict[Manager, set[Path]], writer: Manager) -> None:
    """stripMeta for the writer; a manager that owns nothing goes."""
    if writer in managers:
        managers[writer] = managers[writer] - STRIPPED
    for manager in [m for m, owned in managers.items() if not owned]:
        del managers[manager]


def apply(
    current: Mapping[str, Any] | None,
    config: Mapping[str, Any],
    ownership: Ownership,
    manager_name: str,
    *,
    force: bool,
) -> dict[str, Any]:
    """The object after `manager_name` applies `config` (ownership updated in place).
    Raises ApplyConflict (nothing changed). Status is not touched (it belongs to the
    status subresource)."""
    applier = Manager(manager_name, "Apply")
    live, server = _split_server_metadata(current)
    config = {k: v for k, v in config.items() if k != "status"}
    t = type_of(config if "kind" in config else live)
    keep = _scope("")
    merged = merge(live, config, t)
    managers = {m: set(owned) for m, owned in ownership.fields.items()}
    last = managers.get(applier)
    managers[applier] = {p for p in field_set(config, t) if keep(p)}
    new = _prune(merged, managers, applier, last, t)
    changes = compare(live, new, t).excluding(keep)
    conflicts = sorted(
        ((other, p) for other, owned in managers.items() if other != applier
         for p in owned & (changes.modified | changes.added)),
        key=lambda c: (c[0].name, c[0].operation, c[0].subresource, c[1]),
    )  # fmt: skip
    if conflicts and not force:
        raise ApplyConflict(conflicts, str(config.get("apiVersion", "")))
    taken = {p for _, p in conflicts}
    for other in managers:
        if other != applier:
            managers[other] -= taken | changes.removed
    _settle(managers, applier)
    ownership.fields = managers
    if server:
        new.setdefault("metadata", {}).update(server)
    for key in ("apiVersion", "kind"):
        if key in config:
            new[key] = config[key]
    return apply_defaults(new)


def _prune(
    merged: dict[str, Any],
    managers: Mapping[Manager, set[Path]],
    applier: Manager,
    last: set[Path] | None,
    t: Type,
) -> dict[str, Any]:
    """Updater.prune: remove what the applier sent last time and nobody owns now."""
    if not last:
        return merged
    last_named = with_named_fields(last, t)
    merged_set = with_named_fields(field_set(merged, t), t)
    managed = with_named_fields(set().union(*managers.values()), t)
    # RemoveItems(last), then addBackOwnedItems
    pruned = remove_items(merged, last_named, t)
    pruned_set = with_named_fields(field_set(pruned, t), t)
    pruned = remove_items(merged, merged_set - (pruned_set | managed), t)
    # addBackDanglingItems
    pruned_set = with_named_fields(field_set(pruned, t), t)
    result: dict[str, Any] = remove_items(merged, (merged_set - pruned_set) & last_named, t)
    return result


def update(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    ownership: Ownership,
    manager_name: str,
    *,
    subresource: str = "",
) -> None:
    """Record a non-apply write: its manager owns what it changed or added (and no longer
    what it removed); the other managers lose those fields."""
    writer = Manager(manager_name, "Update", subresource)
    before, _ = _split_server_metadata(old)
    after, _ = _split_server_metadata(new)
    changes = compare(before, after, type_of(after or before)).excluding(_scope(subresource))
    managers = {m: set(owned) for m, owned in ownership.fields.items()}
    for other in managers:
        if other != writer:
            managers[other] -= changes.modified | changes.added | changes.removed
    mine = managers.get(writer, set())
    managers[writer] = (mine - changes.removed) | changes.modified | changes.added
    _settle(managers, writer)
    ownership.fields = managers


def apply_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    for keys, value in DEFAULTS.get((obj.get("apiVersion", ""), obj.get("kind", "")), ()):
        node = obj
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node.setdefault(keys[-1], value)
    return obj
