"""Sluice Kubernetes operator: turns InferenceService objects into serving runtime pods.

Importing the package registers the Kopf handlers, so both
`kopf run --standalone -A -m sluice.operator` and `python -m sluice.operator` work.
Import it as `sluice.operator`, never as `operator` (the standard library owns that name).
"""

from . import handlers as handlers  # noqa: F401  (registers the Kopf handlers)
