"""Where Sluice keeps what it makes once and reuses (converted models, compiled kernels,
the Harmony vocabulary): `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`. The operator's
pods set XDG_CACHE_HOME to their cache volume. One owner, at the lowest floor, so that the
kernels (floor 1) and the model loader read the same rule."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sluice"
