"""`make cluster` / `make cluster-down` (scripts/local_cluster.py up/down): the README's
one-machine walk-through, on a second control plane started in the background; `down`
leaves no process of it behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import local_cluster
import psutil
from cluster_kit import REPO, OperatorProcess, is_ready, wait_until


def processes_naming(text: str) -> list[str]:
    return [
        f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}"
        for p in psutil.process_iter(["cmdline"])
        if text in " ".join(p.info["cmdline"] or [])
    ]


def test_make_cluster_runs_the_readme_commands_and_cluster_down_stops_everything(
    control_plane: local_cluster.ControlPlane, tmp_path
):
    workdir = tmp_path / "cluster"
    script = [sys.executable, str(REPO / "scripts" / "local_cluster.py")]
    up = subprocess.run([*script, "up", "--dir", str(workdir)], capture_output=True, text=True,
                        timeout=400)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip().splitlines() == [f"export KUBECONFIG={workdir / 'admin.kubeconfig'}"]
    env = {**os.environ, "KUBECONFIG": str(workdir / "admin.kubeconfig")}
    kubectl = str(control_plane.kubectl)
    operator = None
    try:
        # the same fake nodes as the test fixture's
        nodes = subprocess.run([kubectl, "get", "nodes", "-o", "name"], env=env,
                               capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
        assert sorted(nodes) == [f"node/{n.name}" for n in local_cluster.DEFAULT_NODES]

        # the README: kubectl apply -f crds/, python -m sluice.operator, kubectl apply -f samples/...
        def run(*args: str) -> str:
            return subprocess.run([kubectl, *args], env=env, capture_output=True, text=True,
                                  check=True).stdout  # fmt: skip

        run("apply", "-f", str(REPO / "crds"))
        run("wait", "--for=condition=Established", "crd/inferenceservices.sluice.dev")
        operator = OperatorProcess([sys.executable, "-m", "sluice.operator"], env,
                                   tmp_path / "operator.log")  # fmt: skip
        operator.start()
        run("apply", "-f", str(REPO / "samples" / "smollm2-cpu.yaml"))
        wait_until(
            "smollm2 Ready",
            lambda: is_ready(json.loads(run("get", "sisvc", "smollm2", "-o", "json"))),
            timeout=120,
            explain=operator.tail,
        )
        assert "Ready" in run("get", "sisvc").splitlines()[1].split()
    finally:
        if operator is not None:
            operator.stop()
        down = subprocess.run([*script, "down", "--dir", str(workdir)], capture_output=True,
                              text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert processes_naming(str(workdir)) == []
    # and the session's own control plane is untouched
    assert all(psutil.pid_exists(pid) for pid in control_plane.pids().values())
