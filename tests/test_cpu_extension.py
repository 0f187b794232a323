"""The CPU kernels' build cache: one folder per source/torch/flags/CPU, no eternal locks."""

from __future__ import annotations

import os
import time

from sluice.runtime.kernels import cpu_extension


def test_the_build_folder_is_keyed_by_the_sources(tmp_path, monkeypatch) -> None:
    first = cpu_extension.build_directory(tmp_path)
    assert first.parent == tmp_path / "kernels"
    assert first == cpu_extension.build_directory(tmp_path)
    monkeypatch.setattr(cpu_extension, "CFLAGS", [*cpu_extension.CFLAGS, "-DOTHER"])
    assert cpu_extension.build_directory(tmp_path) != first


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path) -> None:
    lock = tmp_path / "lock"
    lock.write_text("")
    cpu_extension._clear_stale_lock(tmp_path)
    assert lock.exists()  # a build may be running right now
    old = time.time() - cpu_extension.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    cpu_extension._clear_stale_lock(tmp_path)
    assert not lock.exists()
    cpu_extension._clear_stale_lock(tmp_path)  # no lock: nothing to do
