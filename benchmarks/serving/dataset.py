"""Benchmark prompts: the code lives in `sluice.runtime.workload.dataset` (`sluice simulate`
generates the same workload and computes the same numbers); re-exported here."""

from sluice.runtime.workload.dataset import *  # noqa: F403
