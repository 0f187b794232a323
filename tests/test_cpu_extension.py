"""The CPU kernels' build cache: one folder per source/torch/flags/CPU, no lock that outlives its builder."""

from __future__ import annotations

import fcntl
import subprocess
import sys

import pytest

from sluice.runtime.kernels import cpu_extension


def test_the_build_folder_is_keyed_by_the_sources(tmp_path, monkeypatch) -> None:
    first = cpu_extension.build_directory(tmp_path)
    assert first.parent == tmp_path / "kernels"
    assert first == cpu_extension.build_directory(tmp_path)
    monkeypatch.setattr(cpu_extension, "CFLAGS", [*cpu_extension.CFLAGS, "-DOTHER"])
    assert cpu_extension.build_directory(tmp_path) != first


def test_an_orphaned_build_lock_is_removed_while_the_build_is_held(tmp_path) -> None:
    orphan = tmp_path / "lock"  # cpp_extension's lock file, left by a builder that was killed
    orphan.write_text("")
    with cpu_extension._exclusive_build(tmp_path):
        assert not orphan.exists()
        with open(tmp_path / cpu_extension.BUILD_LOCK, "a") as other:
            with pytest.raises(BlockingIOError):  # a second builder waits for this one
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(tmp_path / cpu_extension.BUILD_LOCK, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released on exit


def test_a_builder_that_dies_releases_the_build(tmp_path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, os, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); os.kill(os.getpid(), 9)"
        ), str(tmp_path / cpu_extension.BUILD_LOCK)],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    holder.wait()
    (tmp_path / "lock").write_text("")  # what a killed cpp_extension build leaves
    with cpu_extension._exclusive_build(tmp_path):
        assert not (tmp_path / "lock").exists()
