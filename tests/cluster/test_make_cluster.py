"""`make cluster` / `make cluster-down` (scripts/local_cluster.py up/down): the README's
one-machine walk-through, on a second control plane started in the background, with the
line `up` prints pasted into a shell; `down` leaves no process of it behind, however the
test in between ends."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import cluster_processes
import local_cluster
import psutil
import pytest
from cluster_kit import REPO, OperatorProcess, is_ready, wait_until

SCRIPT = [sys.executable, str(REPO / "scripts" / "local_cluster.py")]


def processes_naming(workdir: Path) -> list[str]:
    return [
        f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}"
        for p in psutil.process_iter(["cmdline"])
        if cluster_processes.names_dir(p.info["cmdline"] or [], workdir)
    ]


@pytest.fixture
def cluster_dir(control_plane: local_cluster.ControlPlane, tmp_path: Path) -> Iterator[Path]:
    """The `--dir` of a `make cluster` started by the test; `down` runs at the end whatever
    happened (an `up` that failed or timed out half-way included), then nothing of it runs,
    and the session's own control plane is untouched."""
    workdir = tmp_path / "cluster"
    try:
        yield workdir
    finally:
        down = subprocess.run([*SCRIPT, "down", "--dir", str(workdir)], capture_output=True,
                              text=True, timeout=180)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == f"local cluster in {workdir} stopped"
    assert processes_naming(workdir) == []
    assert all(psutil.pid_exists(pid) for pid in control_plane.pids().values())


def test_make_cluster_runs_the_readme_commands_and_cluster_down_stops_everything(
    control_plane: local_cluster.ControlPlane, cluster_dir: Path, tmp_path: Path
):
    up = subprocess.run([*SCRIPT, "up", "--dir", str(cluster_dir)], capture_output=True,
                        text=True, timeout=400)  # fmt: skip
    assert up.returncode == 0, up.stderr
    # one line to paste: the kubeconfig, and the kubectl of the server's release on PATH
    [line] = up.stdout.strip().splitlines()
    assert line == local_cluster.paste_line(
        cluster_dir / "admin.kubeconfig", control_plane.binaries
    )
    assert str(control_plane.kubectl) in up.stderr  # and where that kubectl is, in words

    def shell(command: str) -> str:
        """`command` in a shell where the user pasted `line`."""
        done = subprocess.run(["bash", "-c", f"{line}\n{command}"], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, f"{command}: {done.stderr}"
        return done.stdout

    assert shell("command -v kubectl").strip() == str(control_plane.kubectl)
    version = json.loads(shell("kubectl version -o json"))
    assert version["clientVersion"]["gitVersion"] == version["serverVersion"]["gitVersion"]
    # the same fake nodes as the test fixture's
    nodes = shell("kubectl get nodes -o name").split()
    assert sorted(nodes) == [f"node/{n.name}" for n in local_cluster.DEFAULT_NODES]
    # `up` installed the CRDs (Established: the API serves them); no `kubectl apply -f crds/`
    crd = json.loads(shell("kubectl get crd inferenceservices.sluice.dev -o json"))
    assert {"type": "Established", "status": "True"}.items() <= next(
        c for c in crd["status"]["conditions"] if c["type"] == "Established"
    ).items()

    # the README: python -m sluice.operator &, kubectl apply -f samples/..., kubectl get sisvc
    env = {"KUBECONFIG": str(cluster_dir / "admin.kubeconfig")}
    operator = OperatorProcess([sys.executable, "-m", "sluice.operator"],
                               {**os.environ, **env},
                               tmp_path / "operator.log")  # fmt: skip
    operator.start()
    try:
        shell(f"kubectl apply -f {shlex.quote(str(REPO / 'samples' / 'smollm2-cpu.yaml'))}")
        wait_until(
            "smollm2 Ready",
            lambda: is_ready(json.loads(shell("kubectl get sisvc smollm2 -o json"))),
            timeout=120,
            explain=operator.tail,
        )
        assert "Ready" in shell("kubectl get sisvc").splitlines()[1].split()
    finally:
        operator.stop()
