"""A test-only gate that freezes the scheduler at a point the test chooses.

Tests that must observe a state of a live server (four requests running, one queued) or
keep a request open (a drain in progress) cannot rely on the model being slow: on a fast
machine the state is gone before anyone looks. The gate makes such a test deterministic
by construction: the test arms it, the scheduler stops at the armed point after publishing
its outputs and stats, and resumes only when the test says so.

Off unless the scheduler process starts with `SLUICE_TEST_HOLD_DIR` set (read once, in the
process entry point). Protocol, all through files in that folder:

1. the test writes `arm` holding N (a number of output tokens);
2. after the first tick at whose end some live request has at least N output tokens, the
   scheduler publishes its stats, renames `arm` to `held`, and waits;
3. the test sees `held`, looks at whatever it needs, and deletes `held`: the scheduler goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ENV_HOLD_DIR = "SLUICE_TEST_HOLD_DIR"
POLL_S = 0.01
ARM, HELD = "arm", "held"


@dataclass(frozen=True)
class HoldGate:
    folder: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> HoldGate | None:
        folder = (os.environ if environ is None else environ).get(ENV_HOLD_DIR, "")
        return cls(Path(folder)) if folder else None

    def armed_at(self) -> int | None:
        try:
            return int((self.folder / ARM).read_text().strip())
        except (OSError, ValueError):
            return None

    def hold_if_reached(self, longest_output: int, before_hold: Callable[[], None]) -> bool:
        """Hold (until released) when armed and `longest_output` reached the armed count."""
        at = self.armed_at()
        if at is None or longest_output < at:
            return False
        before_hold()
        os.replace(self.folder / ARM, self.folder / HELD)
        while (self.folder / HELD).exists():
            time.sleep(POLL_S)
        return True
