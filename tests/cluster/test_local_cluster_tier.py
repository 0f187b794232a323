"""How the cluster tier sits in a test run, checked with nested pytest runs that need no Go
and start no control plane:

- without Go the control plane cannot be built: the tier skips with one line on a
  developer's machine, and fails under CI=true (a CI run that skips the tier is not green);
- the tier runs after every other test, so its session control plane and operator stop as
  soon as its last test is done."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_kit import REPO, build_verdict

# seven tests of the tier (every one needs the control plane)
SOME_TESTS = ["tests/cluster/test_control_plane.py", "tests/cluster/test_make_cluster.py"]
NO_GO_LINE = "no Go toolchain on this machine: the local control plane (etcd) cannot be built"


@pytest.mark.parametrize(
    ("returncode", "ci", "verdict"),
    [
        (0, "", "ok"),
        (0, "true", "ok"),
        (3, "", "skip"),
        (3, "false", "skip"),
        (3, "true", "fail"),
        (3, "1", "fail"),
        (1, "", "fail"),
        (1, "true", "fail"),
    ],
)
def test_build_verdict(returncode: int, ci: str, verdict: str):
    stderr = {0: "", 1: "control plane build failed: k8s.io/kubernetes@v1.36.3 (...)",
              3: NO_GO_LINE}[returncode]  # fmt: skip
    got, why = build_verdict(returncode, stderr + "\n", {"CI": ci} if ci else {})
    assert got == verdict
    if verdict != "ok":
        assert stderr in why  # the build script's own line, not a generic one


def _without_go(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    path = [d for d in os.environ["PATH"].split(os.pathsep) if not os.path.exists(f"{d}/go")]
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    env.update(PATH=os.pathsep.join(path), SLUICE_K8S_HOME=str(tmp_path / "k8s"))
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", *SOME_TESTS],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_without_go_the_tier_skips_with_one_line(tmp_path: Path):
    run = _without_go(tmp_path, ci=None)
    assert run.returncode == 0, run.stdout + run.stderr
    # one line for them all, which says why and what CI=true would do
    skipped = [line for line in run.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1, run.stdout
    assert skipped[0].startswith("SKIPPED [7] tests/cluster/conftest.py:"), skipped
    assert "no Go toolchain" in skipped[0] and "under CI=true this fails" in skipped[0]
    assert "7 skipped" in run.stdout


def test_without_go_under_ci_the_tier_fails(tmp_path: Path):
    run = _without_go(tmp_path, ci="true")
    assert run.returncode != 0, run.stdout + run.stderr
    assert "7 errors" in run.stdout, run.stdout
    assert "CI=true, and the cluster tier cannot run: no Go toolchain" in run.stdout, run.stdout
    assert "SKIPPED" not in run.stdout


def test_the_cluster_tier_is_collected_after_every_other_test():
    # the cluster file named first; without the reordering its tests would come first
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/cluster/test_control_plane.py", "tests/test_threads.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    where = ["cluster" if line.startswith("tests/cluster/") else "other" for line in ids]
    assert where.count("cluster") == 6 and where.count("other") >= 1, ids
    assert where == sorted(where, key=lambda w: w == "cluster"), ids
    # each part keeps its own order
    cluster = [line for line in ids if line.startswith("tests/cluster/")]
    assert cluster[0].endswith("::test_every_component_listens_on_loopback_only"), cluster
