"""Taking the API server down when the engine cannot serve, answering every client first.

The engine is the scheduler and detokenizer processes. When one of them dies, or the
watchdog finds the pipeline silent for `--watchdog-timeout` seconds while requests wait
(SGLang's watchdog: a hang a restart would fix), the supervisor

1. ends every request in flight with an error naming the cause (`TokenizerManager
   .engine_down`): non-streamed clients get a 500, streams an error event and `[DONE]`,
   new requests a 503;
2. asks uvicorn to stop (it lets those answers go out and closes idle connections);
3. exits non-zero, at the latest `FORCE_EXIT_S` after step 1 (Kubernetes restarts the pod).

`/health/live` reads the same heartbeat (`--scheduler-heartbeat-timeout`, lower), so a
probe can restart a hung server even with the watchdog off.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

logger = logging.getLogger("sluice.server")

WATCH_INTERVAL_S = 0.5
FORCE_EXIT_S = 10.0  # the graceful way gets this long; then the process exits regardless


class Supervisor:
    def __init__(self, tm: Any, children: Any, server: Any, watchdog_timeout: float) -> None:
        self.tm = tm
        self.children = children
        self.server = server
        self.watchdog_timeout = watchdog_timeout
        self.exit_code = 0

    async def run(self) -> None:
        while self.exit_code == 0:
            await asyncio.sleep(WATCH_INTERVAL_S)
            reason = self.problem()
            if reason is not None:
                self.go_down(reason)

    def problem(self) -> str | None:
        if self.children.dead() is not None:
            return self.children.describe_exits()  # names the tensor-parallel rank
        timeout = self.watchdog_timeout
        if timeout > 0 and self.tm.scheduler_stalled(timeout):
            return (
                f"watchdog: the scheduler sent nothing for {timeout:g} s while "
                f"{self.tm.num_inflight} requests were in flight (hung)"
            )
        return None

    def go_down(self, reason: str) -> None:
        logger.error(
            "%s; answering %d requests in flight with an error and shutting the server down",
            reason, self.tm.num_inflight,
        )  # fmt: skip
        self.exit_code = 1
        self.tm.engine_down(f"The server is shutting down: {reason}.")
        self.server.should_exit = True
        timer = threading.Timer(FORCE_EXIT_S, self._force_exit)
        timer.daemon = True
        timer.start()

    def _force_exit(self) -> None:
        logger.error("the server did not stop within %.0f s; exiting", FORCE_EXIT_S)
        self.children.kill()
        os._exit(1)
