"""A P/D pair on the virtual clock: a prefill replica and a decode replica, each the real
scheduler in its `--disaggregation-mode`, joined by a transfer that costs what moving the
prompt's KV over the network would.

`SimTransfer` plays the TCP transfer's protocol (`disagg/tcp.py`) between the two
schedulers: the decode side reserves, the prefill side sends once its prompt is computed,
and the KV arrives `latency + bytes / bandwidth` after both are there; the prefill side's
pages are freed at once (the bytes are on their way). The pages, rows and queues on both
sides are the schedulers' own.

`SimPDPair` is driven like one replica (`submit`, `advance`, `run_to_completion`): every
request goes to both, the client reads the decode replica. The two clocks are advanced
lagging one first, and an idle replica is brought up to the other's time before the other
runs a tick, so a message between them is at most one tick late.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sluice.runtime.dataclass_cli import option
from sluice.runtime.ipc.messages import (
    DisaggHandoff,
    FirstToken,
    KVReceived,
    KVSent,
    KVTransferFailed,
    SchedulerStats,
)
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import Calibration
from sluice.runtime.sim.replica import RequestTrace, SimReplica, SimRequest


@dataclass(frozen=True)
class TransferCost:
    """What moving one prompt's KV between the two servers costs."""

    bytes_per_token: int
    gbps: float = 10.0  # network bandwidth, gigabits per second
    latency_s: float = 0.0005

    def seconds(self, tokens: int) -> float:
        return self.latency_s + tokens * self.bytes_per_token * 8 / (self.gbps * 1e9)


@dataclass(frozen=True)
class PDTopology:
    """The flags `sluice simulate` and `sluice plan` share to put a P/D pair where one
    server would be."""

    pd_disaggregation: bool = option(
        False,
        "A P/D pair instead of each server: a prefill server and a decode server, "
        "each on its own machine as calibrated, every request sent to both (as `sluice "
        "router --pd-disaggregation` does); it counts as two pods.",
    )
    pd_transfer_gbps: float = option(
        10.0,
        "P/D: the network's bandwidth between the two servers, in Gbit/s (each "
        "prompt's KV: its tokens x the calibrated model's KV bytes per token).",
    )
    pd_transfer_latency_ms: float = option(0.5, "P/D: a transfer's fixed latency, in ms.")

    def pd_problems(self) -> list[str]:
        if self.pd_transfer_gbps <= 0 or self.pd_transfer_latency_ms < 0:
            return ["--pd-transfer-gbps must be > 0 and --pd-transfer-latency-ms >= 0"]
        return []

    def transfer_cost(self, bytes_per_token: int) -> TransferCost | None:
        """The pair's transfer cost; None when the topology is one server."""
        if not self.pd_disaggregation:
            return None
        return TransferCost(
            bytes_per_token, self.pd_transfer_gbps, self.pd_transfer_latency_ms / 1000
        )


class SimTransfer:
    """The `KVTransfer` both simulated schedulers call (`bind` the replicas first)."""

    bootstrap_port = 0

    def __init__(self, cost: TransferCost) -> None:
        self.cost = cost
        self.prefill: SimReplica | None = None
        self.decode: SimReplica | None = None
        self._computed: dict[int, tuple[float, int, FirstToken]] = {}
        self._reserved: dict[int, float] = {}
        self._failed: dict[int, str] = {}

    def bind(self, prefill: SimReplica, decode: SimReplica) -> None:
        self.prefill, self.decode = prefill, decode

    def _sides(self) -> tuple[SimReplica, SimReplica]:
        assert self.prefill is not None and self.decode is not None, "bind() the replicas first"
        return self.prefill, self.decode

    def send(self, room: int, pages: list[int], tokens: int, first: FirstToken) -> None:
        p, _ = self._sides()
        if (why := self._failed.pop(room, None)) is not None:
            p.post(p.clock.now, KVTransferFailed(room, why))
            return
        self._computed[room] = (p.clock.now, tokens, first)
        self._match(room)

    def fail(self, room: int, message: str) -> None:
        _, d = self._sides()
        if self._reserved.pop(room, None) is not None:
            d.post(d.clock.now, KVTransferFailed(room, message))
        else:
            self._failed[room] = message

    def reserve(self, room: int, bootstrap: str, pages: list[int], tokens: int) -> None:
        _, d = self._sides()
        if (why := self._failed.pop(room, None)) is not None:
            d.post(d.clock.now, KVTransferFailed(room, why))
            return
        self._reserved[room] = d.clock.now
        self._match(room)

    def cancel(self, room: int, bootstrap: str = "") -> None:
        p, _ = self._sides()
        self._reserved.pop(room, None)
        if (computed := self._computed.pop(room, None)) is not None:
            p.post(
                max(p.clock.now, computed[0]), KVTransferFailed(room, "the decode side gave it up")
            )
        else:
            self._failed[room] = "the decode side gave it up"

    def close(self) -> None:
        pass

    def _match(self, room: int) -> None:
        if room not in self._computed or room not in self._reserved:
            return
        p, d = self._sides()
        computed_at, tokens, first = self._computed.pop(room)
        reserved_at = self._reserved.pop(room)
        start = max(computed_at, reserved_at)
        arrives = start + self.cost.seconds(tokens)
        p.post(start, KVSent(room, tokens))
        d.post(arrives, KVReceived(room, tokens, first, arrives - reserved_at))


class _PairClock:
    """The client's view of the pair's time: sending advances both replicas' clocks."""

    def __init__(self, pair: SimPDPair) -> None:
        self._pair = pair

    @property
    def now(self) -> float:
        return min(r.clock.now for r in self._pair.replicas)

    def advance_to(self, t: float) -> None:
        for r in self._pair.replicas:
            r.clock.advance_to(t)


class _PairBusy:
    """The pair's CPU use: the mean of its two machines'."""

    def __init__(self, pair: SimPDPair) -> None:
        self._pair = pair

    def utilisation(self, t0: float, t1: float) -> float:
        return sum(r.busy.utilisation(t0, t1) for r in self._pair.replicas) / 2


class SimPDPair:
    def __init__(
        self, args: ServerArgs, calibration: Calibration, cost: TransferCost,
        name: str = "pair", start_time: float = 0.0,
    ) -> None:  # fmt: skip
        self.name = name
        self.transfer = SimTransfer(cost)
        prefill_args = dataclasses.replace(args, disaggregation_mode="prefill")
        decode_args = dataclasses.replace(args, disaggregation_mode="decode")
        self.prefill = SimReplica(prefill_args, calibration, f"{name}-prefill", start_time,
                                  transfer=self.transfer)  # fmt: skip
        self.decode = SimReplica(decode_args, calibration, f"{name}-decode", start_time,
                                 transfer=self.transfer)  # fmt: skip
        self.busy = _PairBusy(self)
        self.transfer.bind(self.prefill, self.decode)
        self.replicas = (self.prefill, self.decode)
        self.clock = _PairClock(self)
        self.overlap = self.decode.overlap
        self.pool = self.decode.pool
        self.trace = None
        self._rooms = 0

    @property
    def traces(self) -> dict[str, RequestTrace]:
        return self.decode.traces  # what the client reads

    @property
    def ticks(self) -> int:
        return self.prefill.ticks + self.decode.ticks

    @property
    def idle(self) -> bool:
        return self.prefill.idle and self.decode.idle

    def submit(self, req: SimRequest) -> None:
        self._rooms += 1
        paired = dataclasses.replace(req, handoff=DisaggHandoff("sim", self._rooms))
        self.prefill.submit(paired)
        self.decode.submit(paired)

    def advance(self, limit: float = math.inf) -> None:
        """One step of the lagging replica; an idle one is first brought up to the other's
        time (or its next event, or `limit`); when both wait, both clocks move on."""
        lag, lead = sorted(self.replicas, key=lambda r: r.clock.now)
        if lag.step():
            return
        catch_up = min(limit, lead.clock.now, lag.next_arrival or math.inf)
        if lag.clock.now < catch_up < math.inf:
            lag.clock.now = catch_up
            return
        if lead.step():
            return
        due = [t for t in (self.prefill.next_arrival, self.decode.next_arrival) if t is not None]
        target = min([limit, *due])
        if target < math.inf:
            self.clock.advance_to(target)

    def run_until(self, t: float) -> None:
        while self.clock.now < t:
            self.advance(t)

    def run_to_completion(self) -> None:
        while not self.idle:
            self.advance()

    def take_finished(self) -> list[RequestTrace]:
        self.prefill.take_finished()
        return self.decode.take_finished()

    def stats(self) -> SchedulerStats:
        """The decode replica's stats, with the prefill replica's queue and prefill counts
        (what a plan scales the pair on)."""
        stats, p = self.decode.stats(), self.prefill.stats()
        stats.queue_requests += p.queue_requests
        stats.queue_prompt_tokens = p.queue_prompt_tokens
        stats.prefill_batches_total = p.prefill_batches_total
        stats.prefill_rows_total = p.prefill_rows_total
        stats.computed_prompt_tokens_total += p.computed_prompt_tokens_total
        stats.disagg_sent_tokens_total = p.disagg_sent_tokens_total
        return stats

    def check_integrity(self) -> None:
        for r in self.replicas:
            r.check_integrity()
