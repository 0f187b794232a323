"""What the reliability tests share: a tiny model with a padded vocabulary, clients that
record what they saw, and the server's process tree."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TOKENIZER_SIZE = 512  # the tiny tokenizer's
PADDED_VOCAB = 640  # the model's embedding: ids in [512, 640) are valid, 640 is not


def make_padded_llama(folder: Path) -> Path:
    from tiny_model import make_tiny_llama

    return make_tiny_llama(folder, vocab_size=PADDED_VOCAB)


def process_tree(pid: int) -> list[int]:
    """`pid` and every live descendant."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def tree_rss_mib(pid: int) -> float:
    """Resident memory of `pid` and its descendants (VmRSS summed)."""
    total = 0
    for p in process_tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class StreamOutcome:
    """What one streaming client saw."""

    status: int = 0
    events: list[Any] = field(default_factory=list)
    closed_early: bool = False  # the connection ended without [DONE]
    ended_at: float = 0.0

    @property
    def error(self) -> dict[str, Any] | None:
        errors = [e for e in self.events if isinstance(e, dict) and "error" in e]
        return errors[-1]["error"] if errors else None

    @property
    def done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


async def stream_until_end(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], started: asyncio.Event | None = None
) -> StreamOutcome:
    """POST a streaming request and read it to its end; `started` is set at the first event."""
    out = StreamOutcome()
    try:
        async with client.stream("POST", url, json=body) as r:
            out.status = r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    payload = line[len("data: ") :]
                    out.events.append(payload if payload == "[DONE]" else json.loads(payload))
                    if started is not None:
                        started.set()
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.ConnectError):
        out.closed_early = True
    out.ended_at = time.monotonic()
    out.closed_early = out.closed_early or not out.done
    return out


def scheduler_stats(info: dict[str, Any]) -> dict[str, Any]:
    return info.get("scheduler_stats", {})
