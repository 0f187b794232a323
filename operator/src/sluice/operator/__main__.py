"""`python -m sluice.operator [flags]`: run the operator with settings from env and flags."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import kopf

from . import handlers as handlers  # noqa: F401  (registers the Kopf handlers)
from .settings import Settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = Settings.from_env(os.environ).with_flags(sys.argv[1:] if argv is None else argv)
    kopf.configure(verbose=settings.verbose, log_format=kopf.LogFormat[settings.log_format.upper()])
    kopf.run(
        clusterwide=settings.clusterwide,
        namespaces=settings.namespaces,
        # HA is our Lease (leader.py): Kopf's own peering is never used
        standalone=True,
        liveness_endpoint=settings.liveness_endpoint,
        memo=kopf.Memo(settings=settings),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
