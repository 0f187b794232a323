"""`--launch-server`: the code lives in `sluice.runtime.workload.server` (`sluice calibrate`
launches its served phase with it too); re-exported here."""

from sluice.runtime.workload.server import *  # noqa: F403
