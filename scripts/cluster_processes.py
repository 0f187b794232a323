"""The processes of the local control plane (local_cluster.py): each started in its own
session (its own process group), found again from /proc after whatever started it died,
and stopped group by group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ControlPlaneError(RuntimeError):
    """A component did not start or did not become ready in time (with its log's tail)."""


# ----------------------------------------------------------------------------- processes
#
# Every component runs in its own session (so its own process group: pgid == pid), and the
# state file under the cluster's directory lists each one (pid, pgid, the kernel's start time
# of the pid, to tell a reused pid apart) from the moment it is started. `down` stops what
# the file lists, and then any process of a component binary whose command line still names
# the cluster's directory (one started in the instant before the file was written), however
# the process that started them ended.


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    pgid: int
    state: str  # "Z": a zombie, gone but not yet reaped
    start: int  # clock ticks after boot: with the pid, names one process for good


def proc_stat(pid: int) -> ProcStat | None:
    """The process `pid` as /proc sees it, or None when there is none."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itrealvalue starttime ..."; comm may
    # hold spaces and parentheses
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(pid, int(fields[1]), int(fields[2]), fields[0], int(fields[19]))


def all_processes() -> list[ProcStat]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := proc_stat(int(entry))) is not None:
            found.append(stat)
    return found


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def names_dir(argv: Sequence[str], workdir: Path) -> bool:
    """Whether a command line names `workdir` or a path under it."""
    base = str(workdir)
    return any(arg == base or arg.endswith("=" + base) or base + os.sep in arg for arg in argv)


def same_process(pid: int, start: int | None) -> bool:
    """`pid` is alive (not a zombie) and, when `start` is known, is the process that was
    recorded (not a later one given the same pid)."""
    stat = proc_stat(pid)
    return stat is not None and stat.state != "Z" and (start is None or stat.start == start)


def group_members(pgid: int, start: int | None = None) -> list[int]:
    """The live processes of the group `pgid` leads or led. None when its leader's pid now
    names another process (the group is gone and the pid was given to a new one)."""
    leader = proc_stat(pgid)
    if leader is not None and start is not None and leader.start != start:
        return []
    return [p.pid for p in all_processes() if p.pgid == pgid and p.state != "Z"]


def _die_with_parent() -> Callable[[], None] | None:
    """For `preexec_fn`: the child is SIGKILLed when the thread that started it dies (Linux's
    PR_SET_PDEATHSIG), so a test run killed with SIGKILL leaves no component behind."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def popen_group(
    argv: Sequence[str],
    log: Path,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `argv` in a new session (its own process group), output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as a group
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent() if die_with_parent else None,
        )


@dataclass
class Component:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    start_time: int | None = None

    def start(self, env: Mapping[str, str] | None = None, die_with_parent: bool = False) -> None:
        self.process = popen_group(self.argv, self.log, env, die_with_parent)
        stat = proc_stat(self.process.pid)
        self.start_time = stat.start if stat is not None else None

    def record(self) -> dict[str, Any]:
        assert self.process is not None
        pid = self.process.pid
        return {"pid": pid, "pgid": pid, "start": self.start_time, "argv0": self.argv[0]}

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with status {self.process.returncode}:\n{self.tail()}"
            )


def _stop_group(pgid: int, timeout: float, start: int | None = None) -> bool:
    """SIGTERM the process group `pgid` (its leader had start time `start`, when known),
    SIGKILL what is left after `timeout`; True when none of it is left."""

    def left() -> list[int]:
        try:  # reap the leader when it is our child
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:
            pass
        return group_members(pgid, start)

    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not left():
            return True
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        deadline = time.monotonic() + wait
        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
    return not left()


def wait_for(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    alive: Callable[[], None] = lambda: None,
    interval: float = 0.2,
) -> None:
    """Poll `check` until it is true; `alive` raises when a process it needs has died."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        alive()
        try:
            if check():
                return
        except Exception as error:  # a component that is not up yet refuses connections
            last = error
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"{what}: not ready after {timeout:.0f} s"
                + (f" (last error: {last})" if last else "")
            )
        time.sleep(interval)
