"""Many simulated replicas behind a router, scaled by an autoscaler, over a traffic trace.

What a cluster would do, in virtual time:

- pods: created Pending (`pending_s`: scheduling, container start), then Running and
  loading (`startup_s`: the calibration's imports + model load + warm-up; no /metrics yet),
  then Ready: they get traffic and are scraped. A pod picked for removal stops getting
  traffic at once (it fails readiness while draining), drains what it holds for up to
  `drain_timeout_s` (the rest is aborted), and is gone. The Deployment removes pending
  pods first, then unready ones, then the most recently ready (the ReplicaSet's order).
- the router: `sluice router`'s own policy objects over the ready pods, with in-flight
  counts as the router keeps them (sent minus finished).
- metrics: Prometheus scrapes every ready pod's scheduler gauges every `scrape_interval_s`;
  prometheus-adapter serves the latest sample; the saturation rule is evaluated every
  `rule_interval_s`; metrics-server samples CPU every `metrics_resolution_s`.
- the autoscaler: `hpa.HorizontalController` every `hpa_sync_s`.

Every replica is a `SimReplica`: the real scheduler on a virtual clock.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.runtime.router.policies import CacheAwareConfig, make_policy
from sluice.runtime.router.prefix_tree import PrefixTree
from sluice.runtime.router.workers import Worker
from sluice.runtime.server_args import ServerArgs
from sluice.runtime.sim.calibration import Calibration
from sluice.runtime.sim.pd import SimPDPair, TransferCost
from sluice.runtime.sim.plan import hpa
from sluice.runtime.sim.plan.policies import PolicySpec
from sluice.runtime.sim.plan.saturation import desired_replicas, peaks
from sluice.runtime.sim.plan.traffic import PlannedRequest
from sluice.runtime.sim.replica import RequestTrace, SimReplica, SimRequest

ROUTER_TREE_CHARS = 2_000_000


@dataclass(frozen=True)
class ClusterTimings:
    startup_s: float  # Running to Ready: imports, model load, warm-up
    pending_s: float = 2.0  # created to Running
    drain_timeout_s: float = 25.0
    scrape_interval_s: float = 15.0
    rule_interval_s: float = 15.0
    hpa_sync_s: float = hpa.SYNC_PERIOD_S
    metrics_resolution_s: float = 15.0


@dataclass
class Pod:
    name: str
    created: float
    running_at: float
    ready_at: float
    replica: SimReplica | SimPDPair
    worker: Worker
    cpu_request_milli: int
    deleting_since: float | None = None
    gone_at: float | None = None
    sent: int = 0
    done: int = 0
    pending_finishes: list[float] = field(default_factory=list)  # finish times not yet reached
    samples: list[tuple[float, float, float]] = field(default_factory=list)  # (t, kv, queue)
    cpu_sample: hpa.CpuSample | None = None

    def ready(self, t: float) -> bool:
        return self.deleting_since is None and self.gone_at is None and t >= self.ready_at

    def scraped(self, t: float) -> bool:
        return self.gone_at is None and t >= self.ready_at

    def view(self, t: float) -> hpa.PodView:
        running = t >= self.running_at
        return hpa.PodView(
            self.name,
            "Running" if running else "Pending",
            ready=self.ready(t),
            deleting=self.deleting_since is not None,
            start_time=self.running_at if running else None,
            ready_transition=(self.ready_at if t >= self.ready_at else self.running_at) if running else None,
            cpu_request_milli=self.cpu_request_milli,
        )

    def deletion_rank(self, t: float) -> tuple[int, int, float, float]:
        """Sorts the pods a scale-down removes first (ReplicaSet: pending, then not ready,
        then ready for the shortest time, then newest)."""
        return (0 if t < self.running_at else 1, 1 if self.ready(t) else 0, -self.ready_at, -self.created)


@dataclass
class ScaleEvent:
    at: float
    before: int
    after: int


@dataclass
class FleetResult:
    policy: PolicySpec
    traces: list[RequestTrace]
    failed: list[str]  # rids that got no answer (no ready pod, or aborted while draining)
    pods: list[Pod]
    scale_events: list[ScaleEvent]
    end: float
    timeline: list[dict[str, float]]
    ticks: int
    pods_per_replica: int = 1  # a P/D replica is a prefill pod and a decode pod


class Fleet:
    def __init__(
        self,
        policy: PolicySpec,
        server_args: ServerArgs,
        calibration: Calibration,
        timings: ClusterTimings,
        routing: str = "random",
        initial_replicas: int | None = None,
        cpu_cores: float | None = None,
        seed: int = 0,
        transfer: TransferCost | None = None,
    ) -> None:
        """`transfer`: each replica is a P/D pair joined by a transfer of that cost."""
        self.transfer = transfer
        self.policy = policy
        self.args = server_args
        self.calibration = calibration
        self.timings = timings
        self.router = make_policy(routing, CacheAwareConfig()) if routing != "random" else None
        if routing == "random":
            from sluice.runtime.router.policies import Random

            self.router = Random(seed)
        self.cpu_request_milli = int(1000 * (cpu_cores or calibration.model.torch_threads or 1))
        self.pods: list[Pod] = []
        self._pod_seq = 0
        self.spec_replicas = initial_replicas or policy.min_replicas
        if policy.kind == "static":
            self.spec_replicas = policy.replicas
        self.controller = hpa.HorizontalController(policy.min_replicas, policy.max_replicas, policy.behavior)
        self.scale_events: list[ScaleEvent] = []
        self.recorded: float | None = None  # the saturation rule's last value
        self.traces: dict[str, RequestTrace] = {}
        self.failed: list[str] = []
        self.timeline: list[dict[str, float]] = []
        self._minute_arrivals = 0
        for _ in range(self.spec_replicas):  # the fleet starts warm
            self._new_pod(0.0, ready_now=True)

    # ---- pods ---------------------------------------------------------------------------
    def _new_pod(self, t: float, ready_now: bool = False) -> Pod:
        self._pod_seq += 1
        name = f"pod-{self._pod_seq}"
        running = t if ready_now else t + self.timings.pending_s
        ready = t if ready_now else running + self.timings.startup_s
        replica: SimReplica | SimPDPair
        if self.transfer is not None:
            replica = SimPDPair(self.args, self.calibration, self.transfer, name, ready)
        else:
            replica = SimReplica(self.args, self.calibration, name=name, start_time=ready)
        worker = Worker(url=name, tree=PrefixTree(ROUTER_TREE_CHARS), healthy=True)
        pod = Pod(name, t, running, ready, replica, worker, self.cpu_request_milli)
        self.pods.append(pod)
        return pod

    def alive(self) -> list[Pod]:
        return [p for p in self.pods if p.gone_at is None]

    def _scale_to(self, t: float, replicas: int) -> None:
        current = [p for p in self.alive() if p.deleting_since is None]
        if replicas > len(current):
            for _ in range(replicas - len(current)):
                self._new_pod(t)
        elif replicas < len(current):
            for pod in sorted(current, key=lambda p: p.deletion_rank(t))[: len(current) - replicas]:
                pod.deleting_since = t
                if t < pod.ready_at:  # never served: gone at once
                    pod.gone_at = t

    # ---- time ---------------------------------------------------------------------------
    def _advance(self, t: float) -> None:
        for pod in self.alive():
            if t < pod.ready_at:
                continue
            pod.replica.run_until(t)
            for trace in pod.replica.take_finished():
                self.traces[trace.rid] = trace
                assert trace.finished_at is not None
                heapq.heappush(pod.pending_finishes, trace.finished_at)
            while pod.pending_finishes and pod.pending_finishes[0] <= t:
                heapq.heappop(pod.pending_finishes)
                pod.done += 1
            pod.worker.in_flight = pod.sent - pod.done
            if pod.deleting_since is not None:
                deadline = pod.deleting_since + self.timings.drain_timeout_s
                last = max((tr.finished_at or 0.0 for tr in pod.replica.traces.values()), default=0.0)
                if pod.replica.idle and not pod.pending_finishes and last <= deadline:
                    pod.gone_at = max(pod.deleting_since, last)  # drained: it exits
                elif t >= deadline:
                    pod.gone_at = deadline  # killed at the end of its grace period
                    for rid, tr in pod.replica.traces.items():
                        if tr.finished_at is None or tr.finished_at > deadline:
                            self.failed.append(rid)

    def _route(self, t: float, req: PlannedRequest, rid: str) -> None:
        ready = [p for p in self.alive() if p.ready(t)]
        if not ready:
            self.failed.append(rid)
            return
        workers = [p.worker for p in ready]
        assert self.router is not None
        chosen = self.router.choose(workers, req.input_ids).worker
        pod = next(p for p in ready if p.worker is chosen)
        pod.sent += 1
        pod.worker.in_flight += 1
        pod.replica.submit(SimRequest(rid, list(req.input_ids), req.max_new_tokens, t))

    # ---- metrics and the autoscaler -----------------------------------------------------
    def _scrape(self, t: float) -> None:
        for pod in self.alive():
            if pod.scraped(t):
                stats = pod.replica.stats()
                pod.samples.append((t, stats.kv_token_usage, float(stats.queue_requests)))
                if len(pod.samples) > 64:
                    del pod.samples[:-32]

    def _metrics_server(self, t: float) -> None:
        w = self.timings.metrics_resolution_s
        for pod in self.alive():
            if t < pod.running_at:
                continue
            if t < pod.ready_at:
                busy = 1.0  # loading the model
            else:
                busy = pod.replica.busy.utilisation(max(t - w, pod.ready_at), t)
            pod.cpu_sample = hpa.CpuSample(int(busy * pod.cpu_request_milli), t, w)

    def _evaluate_rule(self, t: float) -> None:
        samples = {p.name: p.samples for p in self.pods if p.samples}
        found = peaks(samples, t, self.policy.saturation.window_s)
        d = desired_replicas(found, self.policy.saturation)
        self.recorded = None if d is None else float(d)

    def _metric_fns(self, t: float) -> list[hpa.MetricFn]:
        pods = self.alive()
        views = [p.view(t) for p in pods]
        kind = self.policy.kind
        if kind == "cpu":
            samples = {p.name: p.cpu_sample for p in pods if p.cpu_sample is not None}
            target = self.policy.cpu_target_percent
            return [lambda spec, status: hpa.resource_utilisation_replicas(views, samples, spec, target, t)]  # type: ignore[arg-type]
        if kind == "saturation":
            value = self.recorded

            def external(spec: int, status: int) -> int:
                if value is None:
                    raise hpa.MetricError("no series for the saturation metric")
                return hpa.external_per_pod_replicas([value], status, 1.0)

            return [external]
        fns: list[hpa.MetricFn] = []
        for metric, target in self.policy.metrics:
            index = 1 if metric == "kvTokenUsage" else 2
            values = {p.name: p.samples[-1][index] for p in pods if p.samples and p.scraped(t)}

            def plain(spec: int, status: int, values: dict[str, float] = values, target: float = target) -> int:
                return hpa.plain_metric_replicas(views, values, spec, target, t)

            fns.append(plain)
        return fns

    def _autoscale(self, t: float) -> None:
        if self.policy.kind == "static":
            return
        status = len([p for p in self.alive() if p.deleting_since is None])
        desired = self.controller.reconcile(t, self.spec_replicas, status, self._metric_fns(t))
        if desired != self.spec_replicas:
            self.scale_events.append(ScaleEvent(t, self.spec_replicas, desired))
            self.spec_replicas = desired
            self._scale_to(t, desired)

    # ---- the run ------------------------------------------------------------------------
    def run(self, requests: Sequence[PlannedRequest], duration_s: float) -> FleetResult:
        t_ = self.timings
        periodic = [
            (t_.scrape_interval_s, 0.0, self._scrape),
            (t_.metrics_resolution_s, 0.5, self._metrics_server),
            (t_.rule_interval_s, 1.0, self._evaluate_rule),
            (t_.hpa_sync_s, 2.0, self._autoscale),
            (60.0, 0.0, self._record_minute),
        ]
        events: list[tuple[float, int, int]] = []  # (time, order, periodic index)
        for i, (_, offset, _) in enumerate(periodic):
            heapq.heappush(events, (offset, i, i))
        arrivals = iter(enumerate(requests))
        nxt = next(arrivals, None)
        t = 0.0
        while True:
            t_periodic = events[0][0]
            t_arrival = nxt[1].arrival if nxt is not None else math.inf
            if t_arrival <= t_periodic:
                if t_arrival > duration_s:
                    nxt = None
                    continue
                self._advance(t_arrival)
                i, req = nxt
                self._minute_arrivals += 1
                self._route(t_arrival, req, f"req-{i}")
                nxt = next(arrivals, None)
                continue
            if t_periodic > duration_s and nxt is None and not self._busy():
                t = max(t, duration_s)
                break
            t, order, idx = heapq.heappop(events)
            self._advance(t)
            periodic[idx][2](t)
            heapq.heappush(events, (t + periodic[idx][0], order, idx))
            if t > duration_s + 3600:
                break  # a safety net: the last requests had an hour to finish
        end = max(t, duration_s)
        for pod in self.pods:
            for tr in pod.replica.traces.values():
                if tr.rid not in self.traces:
                    self.traces[tr.rid] = tr
        return FleetResult(self.policy, list(self.traces.values()), self.failed, self.pods,
                           self.scale_events, end, self.timeline,
                           sum(p.replica.ticks for p in self.pods),
                           2 if self.transfer is not None else 1)  # fmt: skip

    def _busy(self) -> bool:
        return any(not p.replica.idle for p in self.alive())

    def _record_minute(self, t: float) -> None:
        alive = self.alive()
        self.timeline.append({
            "t": t,
            "arrivals": float(self._minute_arrivals),
            "spec_replicas": float(self.spec_replicas),
            "ready_replicas": float(sum(1 for p in alive if p.ready(t))),
            "pods": float(len(alive)),
            "queue": float(sum(p.replica.stats().queue_requests for p in alive if t >= p.ready_at)),
        })  # fmt: skip
        self._minute_arrivals = 0
