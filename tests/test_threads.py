"""How many threads the model worker takes: affinity, capped by the cgroup CPU quota."""

from __future__ import annotations

import os

import pytest

from sluice.runtime import threads


@pytest.mark.parametrize(
    "text,limit",
    [("max 100000", None), ("150000 100000", 1.5), ("200000 100000\n", 2.0), ("", None),
     ("garbage", None), ("0 100000", None)],
)  # fmt: skip
def test_cgroup_cpu_max_parses_to_cpus(text: str, limit: float | None) -> None:
    assert threads.cgroup_cpu_limit(text) == limit


def test_the_quota_caps_the_cores(tmp_path, monkeypatch) -> None:
    cores = len(os.sched_getaffinity(0))
    cpu_max = tmp_path / "cpu.max"
    monkeypatch.setattr(threads, "CGROUP_CPU_MAX", cpu_max)
    cpu_max.write_text("max 100000")
    assert threads.model_worker_threads() == (cores, f"{cores} cores in the affinity mask")
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(8)))
    cpu_max.write_text("250000 100000")
    assert threads.model_worker_threads() == (3, "cgroup CPU quota 2.5 of 8 cores")
    assert threads.model_worker_threads(requested=5) == (5, "--torch-threads")
    assert threads.model_worker_threads(default=2) == (2, "torch's default")  # under the quota
    assert threads.model_worker_threads(default=6)[0] == 3  # the quota caps torch's default
    cpu_max.unlink()  # no cgroup v2 file: the affinity mask decides
    assert threads.model_worker_threads()[0] == 8
