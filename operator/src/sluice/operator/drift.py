"""Whether a child needs applying: skip the server-side apply of an object that is already
as rendered, so a resync of an unchanged service writes nothing.

Two checks, both needed:

- the rendered object's hash, recorded in the child's `sluice.dev/applied-hash`
  annotation by the apply itself, is the current rendering's: a spec change that removes
  a field (an env var, a toleration) changes the hash, and the apply that follows releases
  the field; a check of the values alone would miss a removal;
- every value the operator renders is in the stored object (`contains`): an edit by
  someone else (`kubectl edit`, a controller) of a field the operator sets is reverted.
  Numbers and strings compare by text (the API server stores quantities as strings),
  list items with a `name` match by name (an injected sidecar container does not count as
  drift), other lists item by item. What the server adds (defaults, status) is ignored.

Anything unsure applies: the cost of a wrong "changed" is one no-op apply.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from . import constants as c


def rendered_hash(obj: Mapping[str, Any]) -> str:
    """A hash of the rendered object, its own hash annotation left out."""
    body = json.loads(json.dumps(obj))
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    annotations.pop(c.ANNOTATION_APPLIED_HASH, None)
    if not annotations and "annotations" in (body.get("metadata") or {}):
        del body["metadata"]["annotations"]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stamped(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with its hash annotation."""
    result = json.loads(json.dumps(obj))
    meta = result.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        c.ANNOTATION_APPLIED_HASH: rendered_hash(obj),
    }
    return result


def up_to_date(rendered: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether applying `rendered` (stamped) over `current` would change nothing."""
    if current is None:
        return False
    annotations = (current.get("metadata") or {}).get("annotations") or {}
    if annotations.get(c.ANNOTATION_APPLIED_HASH) != rendered_hash(rendered):
        return False
    return contains(current, rendered)


def contains(stored: Any, rendered: Any) -> bool:
    if isinstance(rendered, Mapping):
        return isinstance(stored, Mapping) and all(
            key in stored and contains(stored[key], value) for key, value in rendered.items()
        )
    if isinstance(rendered, list):
        if not isinstance(stored, list):
            return False
        if rendered and all(isinstance(item, Mapping) and "name" in item for item in rendered):
            by_name = {item.get("name"): item for item in stored if isinstance(item, Mapping)}
            return all(
                item["name"] in by_name and contains(by_name[item["name"]], item)
                for item in rendered
            )
        return len(stored) == len(rendered) and all(
            contains(a, b) for a, b in zip(stored, rendered, strict=True)
        )
    if isinstance(rendered, bool) or isinstance(stored, bool):
        return stored is rendered
    if isinstance(rendered, (int, float)) and isinstance(stored, str):
        return stored == str(rendered)
    return bool(stored == rendered)
