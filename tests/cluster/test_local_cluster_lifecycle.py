"""`scripts/local_cluster.py up` killed at any point of its start-up leaves nothing that
`down` cannot stop; an `up` over a half-running cluster starts it afresh instead of calling
it running; a test run killed with SIGKILL takes its control plane and operators with it.

Where to kill is chosen by waiting on the state file (it lists each process as it starts),
never by sleeping. "Nothing left" is checked two ways: no live process in any process group
the state file listed, and no process at all whose command line names the cluster's dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import cluster_processes
import local_cluster
import pytest
from cluster_kit import REPO, wait_until

SCRIPT = REPO / "scripts" / "local_cluster.py"
START_S = 240  # a component's start on a busy 2-core machine


def naming(workdir: Path) -> list[str]:
    """Every live process (any program) whose command line names `workdir`, but this one."""
    found = []
    for stat in cluster_processes.all_processes():
        argv = cluster_processes.cmdline(stat.pid)
        if stat.pid != os.getpid() and stat.state != "Z" and cluster_processes.names_dir(argv, workdir):
            found.append(f"{stat.pid}: {' '.join(argv)[:160]}")
    return found


def recorded(workdir: Path) -> dict[str, Any]:
    return (local_cluster.read_state(workdir) or {}).get("processes", {})


def live_groups(records: dict[str, Any]) -> dict[str, list[int]]:
    return {
        name: members
        for name, rec in records.items()
        if (members := cluster_processes.group_members(rec["pgid"], rec["start"]))
    }


def start_up(workdir: Path, binaries: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), "up", "--dir", str(workdir), "--bin", str(binaries)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_script(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def kill_when_started(
    up: subprocess.Popen[bytes], workdir: Path, component: str, log: Path
) -> dict[str, Any]:
    """SIGKILL `up` as soon as the state file lists `component`'s process; the records."""
    wait_until(
        f"the state file lists {component}",
        lambda: component in recorded(workdir) or up.poll() is not None,
        timeout=START_S,
        explain=lambda: log.read_text(errors="replace")[-3000:],
    )
    up.send_signal(signal.SIGKILL)
    up.wait()
    assert up.returncode == -signal.SIGKILL, log.read_text(errors="replace")[-3000:]
    records = recorded(workdir)
    assert component in records
    return records


def kill_and_down(up: subprocess.Popen[bytes], workdir: Path) -> subprocess.CompletedProcess[str]:
    """Whatever the test left: `up` killed if still running, then `down`."""
    if up.poll() is None:
        up.kill()
        up.wait()
    return run_script("down", "--dir", str(workdir), timeout=180)


def assert_nothing_left(workdir: Path, records: dict[str, Any]) -> None:
    assert live_groups(records) == {}
    assert naming(workdir) == []


@pytest.mark.parametrize("component", ["etcd", "kube-apiserver", "metrics-adapter"])
def test_down_stops_what_an_up_killed_during_start_up_left(
    binaries: Path, tmp_path: Path, component: str
):
    workdir, log = tmp_path / "cluster", tmp_path / "up.log"
    up = start_up(workdir, binaries, log)
    try:
        records = kill_when_started(up, workdir, component, log)
        # what the killed `up` had started is still running: there is something to stop.
        # The kill lands after the poll saw `component`, so `up` may have started the next
        # one meanwhile: the records are the components in order, up to at least `component`
        started = list(local_cluster.COMPONENTS[: len(records)])
        assert list(records) == started and component in started
        assert set(live_groups(records)) == set(started)
        state = local_cluster.read_state(workdir)
        assert state is not None and state["phase"] == "starting"
        assert state["dir"] == str(workdir) and state["owner"]["pid"] == up.pid
    finally:
        down = kill_and_down(up, workdir)
    assert down.returncode == 0, down.stderr
    assert down.stdout.strip() == f"local cluster in {workdir} stopped"
    assert_nothing_left(workdir, records)
    assert not local_cluster.state_file(workdir).exists()
    # and a second `down` finds nothing to do
    again = run_script("down", "--dir", str(workdir), timeout=60)
    assert (again.returncode, again.stdout.strip()) == (0, f"no local cluster in {workdir}")


def test_up_over_a_half_running_cluster_starts_it_afresh(binaries: Path, tmp_path: Path):
    workdir, log = tmp_path / "cluster", tmp_path / "up.log"
    up = start_up(workdir, binaries, log)
    records: dict[str, Any] = {}
    try:
        # 1. `up` died half-way: etcd and the API server run, the rest was never started
        first = kill_when_started(up, workdir, "kube-apiserver", log)
        records.update({f"first {n}": r for n, r in first.items()})
        again = run_script("up", "--dir", str(workdir), "--bin", str(binaries))
        assert again.returncode == 0, again.stderr
        assert "is degraded (phase starting" in again.stderr, again.stderr
        assert live_groups(first) == {}  # the half-started processes were stopped ...
        second = recorded(workdir)  # ... and a whole new cluster started
        records.update({f"second {n}": r for n, r in second.items()})
        assert list(second) == list(local_cluster.COMPONENTS)
        assert set(live_groups(second)) == set(local_cluster.COMPONENTS)
        assert local_cluster.read_state(workdir)["phase"] == "running"

        # 2. a running cluster loses one process: `up` does not call that running
        scheduler = second["kube-scheduler"]
        os.killpg(scheduler["pgid"], signal.SIGKILL)
        wait_until("kube-scheduler gone",
                   lambda: not cluster_processes.group_members(scheduler["pgid"], scheduler["start"]))  # fmt: skip
        third_up = run_script("up", "--dir", str(workdir), "--bin", str(binaries))
        assert third_up.returncode == 0, third_up.stderr
        assert "is degraded (phase running" in third_up.stderr, third_up.stderr
        assert "dead: ['kube-scheduler']" in third_up.stderr, third_up.stderr
        assert live_groups(second) == {}
        third = recorded(workdir)
        records.update({f"third {n}": r for n, r in third.items()})
        assert set(live_groups(third)) == set(local_cluster.COMPONENTS)

        # 3. all of it runs: `up` says so and starts nothing
        fourth_up = run_script("up", "--dir", str(workdir), "--bin", str(binaries))
        assert fourth_up.returncode == 0, fourth_up.stderr
        assert "already running" in fourth_up.stderr
        assert fourth_up.stdout.splitlines() == [
            local_cluster.paste_line(workdir / "admin.kubeconfig", binaries)
        ]
        assert recorded(workdir) == third
    finally:
        down = kill_and_down(up, workdir)
    assert down.returncode == 0, down.stderr
    assert_nothing_left(workdir, records)


# A test run that the kernel kills (SIGKILL, the OOM killer) runs no fixture teardown. This
# child starts a control plane as the session fixture does and an operator as cluster_kit
# does (here a stand-in program: the mechanism, not kopf, is under test), then waits.
CHILD = textwrap.dedent(
    """
    import sys, threading
    sys.path[:0] = [{scripts!r}, {tests!r}, {cluster!r}]
    import local_cluster
    from cluster_kit import OperatorProcess
    from pathlib import Path
    workdir = Path({workdir!r})
    workdir.mkdir(parents=True)
    operator = OperatorProcess([sys.executable, "-c", "import signal; signal.pause()", str(workdir)],
                               {{}}, workdir / "operator.log")
    operator.start()
    (workdir / "operator.pid").write_text(str(operator.process.pid))
    local_cluster.ControlPlane(workdir / "plane", Path({binaries!r}), die_with_parent=True).start()
    threading.Event().wait()
    """
)


def test_a_killed_test_run_takes_its_control_plane_and_operator_with_it(
    binaries: Path, tmp_path: Path
):
    workdir, log = tmp_path / "run", tmp_path / "run.log"
    code = CHILD.format(scripts=str(REPO / "scripts"), tests=str(REPO / "tests"),
                        cluster=str(REPO / "tests" / "cluster"), workdir=str(workdir),
                        binaries=str(binaries))  # fmt: skip
    with open(log, "ab") as out:
        child = subprocess.Popen([sys.executable, "-c", code], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(
            "the child's control plane has its API server",
            lambda: "kube-apiserver" in recorded(workdir / "plane") or child.poll() is not None,
            timeout=START_S,
            explain=lambda: log.read_text(errors="replace")[-3000:],
        )
        assert child.poll() is None, log.read_text(errors="replace")[-3000:]
        records = recorded(workdir / "plane")
        operator_pid = int((workdir / "operator.pid").read_text())
        assert cluster_processes.same_process(operator_pid, None)
        assert set(live_groups(records)) == {"etcd", "kube-apiserver"}
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    # No teardown ran; the kernel's parent-death signal stopped everything. A process being
    # torn down has an empty command line a while before it leaves its group, so wait on all.
    def leftovers() -> list[str]:
        groups = live_groups(records)
        found = naming(workdir) + [f"group {name}: {pids}" for name, pids in groups.items()]
        if cluster_processes.same_process(operator_pid, None):
            found.append(f"operator {operator_pid}")
        return found

    wait_until("no process of the killed run", lambda: not leftovers(), timeout=30,
               explain=lambda: "\n".join(leftovers()))  # fmt: skip
    assert (
        json.loads(local_cluster.state_file(workdir / "plane").read_text())["phase"] == "starting"
    )
