"""The routes around generation: SGLang's POST /abort_request, GET /v1/models, the probes
(/health: ready to serve; /health/live: worth keeping alive) and GET /server_info."""

from __future__ import annotations

import dataclasses
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from sluice.runtime.entrypoints.openai_protocol import AbortRequest
from sluice.runtime.entrypoints.openai_responses import ModelCard, ModelList
from sluice.runtime.entrypoints.serving_base import ServingBase


class ServingAdmin(ServingBase):
    async def abort_request(self, request: Request) -> Response:
        """{"rid": ...} or {"abort_all": true}; the aborted requests end in band."""
        req = await self.parse(request, AbortRequest)
        rids = self.tm.abort_all() if req.abort_all else self.tm.abort(req.rid)
        return JSONResponse({"aborted": rids})

    def models(self) -> dict[str, Any]:
        card = ModelCard(
            id=self.tm.served_model_name,
            created=self.ctx.created,
            root=self.args.model,
            max_model_len=self.tm.context_len,
        )
        body = ModelList(data=[card]).model_dump()
        body["data"] += self.lora.cards(self.tm.served_model_name)
        return body

    def health(self) -> Response:
        if self.tm.is_ready and not self.tm.draining:
            return JSONResponse({"status": "ok"})
        if self.tm.down:
            return JSONResponse({"status": "engine-down"}, 503)
        return JSONResponse({"status": "draining" if self.tm.draining else "starting"}, 503)

    def live(self) -> Response:
        """Liveness: fails for a hung scheduler or a dead engine (a restart helps), never
        while loading or draining (a restart would not). The watchdog reads the same
        heartbeat and takes the server down itself after --watchdog-timeout."""
        if self.tm.down:
            return JSONResponse({"status": "engine-down"}, 503)
        if self.tm.scheduler_stalled(self.args.scheduler_heartbeat_timeout):
            return JSONResponse({"status": "scheduler-stalled"}, 503)
        return JSONResponse({"status": "alive"})

    def server_info(self) -> dict[str, Any]:
        info = dict(self.ctx.flags)
        info.update(self.tm.server_info())
        if self.tm.stats is not None:  # the scheduler's latest SchedulerStats
            info["scheduler_stats"] = dataclasses.asdict(self.tm.stats)
        return info
