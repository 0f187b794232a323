"""Per-request results: the code lives in `sluice.runtime.workload.metrics` (`sluice simulate`
generates the same workload and computes the same numbers); re-exported here."""

from sluice.runtime.workload.metrics import *  # noqa: F403
