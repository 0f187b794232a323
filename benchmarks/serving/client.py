"""The load generator: the code lives in `sluice.runtime.workload.client` (`sluice calibrate`
sends its served phase with it too); re-exported here."""

from sluice.runtime.workload.client import *  # noqa: F403
