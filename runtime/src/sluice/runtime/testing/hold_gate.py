"""A test-only gate that freezes the scheduler at a point the test chooses.

Tests that must observe a state of a live server (four requests running, one queued) or
keep a request open (a drain in progress) cannot rely on the model being slow: on a fast
machine the state is gone before anyone looks. The gate makes such a test deterministic
by construction: the test arms it, the scheduler stops at the armed point after publishing
its outputs and stats, and resumes only when the test says so.

Off unless the scheduler process starts with `SLUICE_TEST_HOLD_DIR` set (read once, by the
process's composition root). Protocol, all through files in that folder:

1. the test writes `arm` holding "N" or "N M" (M defaults to 1);
2. after the first tick at whose end at least M live requests have at least N output tokens
   each, the scheduler publishes its stats, writes them (JSON) to `held`, removes `arm`,
   and waits;
3. the test sees `held`, waits until the server shows the stats written there (they travel
   to the API process through the detokenizer), looks at whatever it needs, and deletes
   `held`: the scheduler goes on.

And, so that requests a test sends "at once" are scheduled at once however the client's
sends are spread in time: while `pause` exists the scheduler takes requests in and
publishes its stats but runs no tick.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENV_HOLD_DIR = "SLUICE_TEST_HOLD_DIR"
POLL_S = 0.01
ARM, HELD, PAUSE = "arm", "held", "pause"


@dataclass(frozen=True)
class HoldGate:
    folder: Path

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> HoldGate | None:
        folder = (os.environ if environ is None else environ).get(ENV_HOLD_DIR, "")
        return cls(Path(folder)) if folder else None

    @property
    def paused(self) -> bool:
        return (self.folder / PAUSE).exists()

    def armed_at(self) -> tuple[int, int] | None:
        """(output tokens, requests) the gate waits for, or None when not armed."""
        try:
            values = [int(v) for v in (self.folder / ARM).read_text().split()]
        except (OSError, ValueError):
            return None
        return (values[0], values[1] if len(values) > 1 else 1) if values else None

    def after_tick(
        self, output_lens: Callable[[], list[int]], publish: Callable[[], dict[str, Any]]
    ) -> None:
        """Hold (until released) when armed and enough live requests reached the mark;
        `publish` sends the stats and returns what it sent (`scheduler.loop.LoopGate`)."""
        armed = self.armed_at()
        if armed is None:
            return
        tokens, requests = armed
        if sum(1 for n in output_lens() if n >= tokens) < requests:
            return
        published = publish()
        tmp = self.folder / f"{HELD}.tmp"
        tmp.write_text(json.dumps(published))
        os.replace(tmp, self.folder / HELD)
        (self.folder / ARM).unlink(missing_ok=True)
        while (self.folder / HELD).exists():
            time.sleep(POLL_S)
