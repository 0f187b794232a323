"""Leaving a process once its work and its own clean-up are done.

A process that has imported torch and transformers spends about a second in the
interpreter's teardown (measured on 2 cores: ~1.2 s for the detokenizer, ~1.3 s for the
API server), freeing objects the kernel frees anyway. A server stopping, and every test
that stops one, waits for that. So each process, after it has closed what it opened, flushes
its output and leaves with `os._exit`.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush stdout, stderr and the log handlers, then end the process with `code`, skipping
    the interpreter's teardown (atexit hooks and object finalizers do not run)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader is gone
            pass
    os._exit(code)


def run_then_exit(entry: Callable[..., object], *args: object) -> NoReturn:
    """A child process's target: run `entry(*args)`, then leave as `exit_now` does, with 0 or
    the code of the `SystemExit` it raised (any other exception is multiprocessing's to
    report, with exit code 1)."""
    code = 0
    try:
        entry(*args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    exit_now(code)
