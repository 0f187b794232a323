"""`sluice plan`: which autoscaling policy serves a traffic trace within the SLO, and at
what cost in replica-hours.

    sluice plan --calibration calibration.json [--trace-file rates.txt | --traffic bursty]
        [--policy hpa:queueDepth=2 saturation cpu:80 static:4]
        [--ttft-slo 2 --itl-slo 0.25] [sluice serve's scheduling flags] --output-file plan.json

Every policy replays the same requests (same seed: same arrivals, prompts and lengths).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.runtime.constants import ROUTER_POLICIES
from sluice.runtime.dataclass_cli import add_flags, option
from sluice.runtime.sim.calibration import Calibration
from sluice.runtime.sim.pd import PDTopology
from sluice.runtime.sim.server_flags import SCHEDULING_FLAGS, add_server_flags, server_args_from

TRAFFIC_KINDS = ("bursty", "diurnal", "constant")
DEFAULT_POLICIES = ("hpa:queueDepth=2", "hpa:queueDepth=8", "hpa:kvTokenUsage=0.8", "saturation", "cpu:80", "static:4")


@dataclass(frozen=True)
class PlanArgs(PDTopology):
    calibration: str = option("calibration.json", "The file `sluice calibrate` wrote.")
    output_file: str = option("", "Write the per-policy results (and per-minute timelines) as JSON here.")
    allow_other_cpu: bool = option(False, "Plan with a CPU calibration measured on another CPU (it then "
                                   "plans for that machine, not this one).")  # fmt: skip
    trace_file: str = option("", "Requests per second for each minute: one value per line (or "
                             "`minute,rate`), or a JSON list. Overrides --traffic.")  # fmt: skip
    traffic: str = option("bursty", "Generated trace when no --trace-file.", TRAFFIC_KINDS)
    duration_minutes: int = option(60, "Length of a generated trace.")
    base_rate: float = option(0.5, "Requests per second: bursty's baseline, diurnal's trough, constant's rate.")
    peak_rate: float = option(3.0, "Requests per second: bursty's bursts, diurnal's peak.")
    burst_minutes: int = option(6, "bursty: length of each burst.")
    bursts: int = option(4, "bursty: how many bursts.")
    period_minutes: float = option(1440.0, "diurnal: length of one day.")
    input_len: int = option(256, "Longest prompt, tokens.")
    input_min: int = option(64, "Shortest prompt, tokens.")
    output_len: int = option(192, "Longest output, tokens.")
    output_min: int = option(32, "Shortest output, tokens.")
    shared_prefix_len: int = option(0, "Tokens of a system prompt each request starts with (0: none).")
    num_prefixes: int = option(1, "Distinct system prompts (with --shared-prefix-len).")
    policy: tuple[str, ...] = option(
        DEFAULT_POLICIES, "Policies to compare: hpa:queueDepth=T[,kvTokenUsage=T], "
        "saturation[:kv=..,queue=..,kvSpare=..,queueSpare=..], cpu:PERCENT, static:N.",
    )
    min_replicas: int = option(1, "Autoscaler's minReplicas (and the replicas at the start).")
    max_replicas: int = option(4, "Autoscaler's maxReplicas.")
    scale_up_window: int = option(0, "behavior.scaleUp.stabilizationWindowSeconds (the CRD's default).")
    scale_down_window: int = option(300, "behavior.scaleDown.stabilizationWindowSeconds (the CRD's default).")
    routing_policy: str = option(
        "random", "How requests are spread over ready pods: random (a Service) or `sluice router`'s.",
        ROUTER_POLICIES,
    )
    pod_pending_seconds: float = option(2.0, "From pod creation to its container running.")
    startup_seconds: float = option(0.0, "From running to ready (0: the calibration's measured imports + model load + warm-up).")
    drain_seconds: float = option(25.0, "What a removed pod gets to finish its requests (the operator's drain timeout).")
    scrape_interval: float = option(15.0, "Prometheus scrape interval (the operator's PodMonitor: 15 s).")
    hpa_sync_period: float = option(15.0, "kube-controller-manager's --horizontal-pod-autoscaler-sync-period.")
    cpu_cores: float = option(0.0, "A pod's CPU request, for the CPU policy (0: the calibration's threads).")
    ttft_slo: float = option(2.0, "SLO: time to first token, seconds.")
    itl_slo: float = option(0.25, "SLO: a request's mean inter-token latency, seconds.")
    seed: int = option(1, "Seed of the trace, the prompts and the random router.")
    jobs: int = option(1, "Policies simulated at once, one process each (the results do not depend on it).")

    def validate(self) -> None:
        problems = self.pd_problems()
        if self.duration_minutes < 1:
            problems.append("--duration-minutes must be >= 1")
        if self.base_rate < 0 or self.peak_rate < 0:
            problems.append("rates must be >= 0")
        if not 1 <= self.min_replicas <= self.max_replicas:
            problems.append("need 1 <= --min-replicas <= --max-replicas")
        if self.ttft_slo <= 0 or self.itl_slo <= 0:
            problems.append("SLOs must be > 0")
        if not self.policy:
            problems.append("name at least one --policy")
        for flag, v in (("--pod-pending-seconds", self.pod_pending_seconds), ("--startup-seconds", self.startup_seconds),
                        ("--drain-seconds", self.drain_seconds), ("--cpu-cores", self.cpu_cores)):  # fmt: skip
            if v < 0:
                problems.append(f"{flag} must be >= 0")
        if self.jobs < 1:
            problems.append("--jobs must be >= 1")
        if self.scrape_interval <= 0 or self.hpa_sync_period <= 0:
            problems.append("--scrape-interval and --hpa-sync-period must be > 0")
        if problems:
            raise ValueError("; ".join(problems))


def add_parser_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, PlanArgs)
    add_server_flags(parser, SCHEDULING_FLAGS)


def build_trace(args: PlanArgs) -> Any:
    from sluice.runtime.sim.plan.traffic import RateTrace

    if args.trace_file:
        return RateTrace.from_file(Path(args.trace_file))
    if args.traffic == "diurnal":
        return RateTrace.diurnal(args.duration_minutes, args.peak_rate, args.base_rate,
                                 args.period_minutes, args.period_minutes / 2)  # fmt: skip
    if args.traffic == "constant":
        return RateTrace(tuple([args.base_rate] * args.duration_minutes))
    return RateTrace.bursty(args.duration_minutes, args.base_rate, args.peak_rate,
                            args.burst_minutes, args.bursts, args.seed)  # fmt: skip


def run_plan(args: PlanArgs, server_args: Any, calibration: Calibration, log: Any = print) -> dict[str, Any]:
    from sluice.runtime.sim.plan import hpa
    from sluice.runtime.sim.plan.fleet import ClusterTimings
    from sluice.runtime.sim.plan.policies import parse_policy
    from sluice.runtime.sim.plan.report import Slo, format_table
    from sluice.runtime.sim.plan.traffic import RequestShape, planned_requests, poisson_arrivals

    behavior = hpa.Behavior(
        scale_up=hpa.rules(args.scale_up_window, hpa.DEFAULT_SCALE_UP),
        scale_down=hpa.rules(args.scale_down_window, hpa.DEFAULT_SCALE_DOWN),
    )
    policies = [parse_policy(p, args.min_replicas, args.max_replicas, behavior) for p in args.policy]
    shape = RequestShape(args.input_len, args.input_min, args.output_len, args.output_min,
                         args.shared_prefix_len, args.num_prefixes)  # fmt: skip
    problems = shape.problems()
    if problems:
        raise ValueError("; ".join(problems))
    trace = build_trace(args)
    arrivals = poisson_arrivals(trace, args.seed)
    facts = calibration.model
    requests = planned_requests(arrivals, shape, facts.vocab_size, set(facts.eos_token_ids), args.seed)
    startup = args.startup_seconds or calibration.startup.total_s
    timings = ClusterTimings(
        startup_s=startup, pending_s=args.pod_pending_seconds, drain_timeout_s=args.drain_seconds,
        scrape_interval_s=args.scrape_interval, hpa_sync_s=args.hpa_sync_period,
    )  # fmt: skip
    slo = Slo(args.ttft_slo, args.itl_slo)
    log(f"trace: {len(trace.per_minute)} minutes, {len(requests)} requests "
        f"(mean {len(requests) / trace.duration_s:.2f} req/s, peak minute {max(trace.per_minute):.2f} req/s); "
        f"pod start-up {startup:.1f} s")  # fmt: skip
    transfer = args.transfer_cost(facts.bytes_per_token)
    jobs = [(policy, server_args, calibration, timings, args.routing_policy, args.cpu_cores or None,
             args.seed, requests, trace.duration_s, slo, transfer) for policy in policies]  # fmt: skip
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            done = list(pool.map(simulate_policy, jobs))
    else:
        done = [simulate_policy(job) for job in jobs]
    rows = []
    timelines = {}
    for row, timeline in done:
        rows.append(row)
        timelines[row["policy"]] = timeline
        log(f"  {row['policy']}: {row['slo_attainment']:.1%} within the SLO, {row['replica_hours']:.2f} "
            f"replica-hours, {row['scale_events']} scale events ({row['wall_seconds']:.0f} s)")  # fmt: skip
    table = format_table(rows, slo)
    return {
        "config": {**dataclasses.asdict(args), "server_args": {n: getattr(server_args, n) for n in SCHEDULING_FLAGS}},
        "calibration": {"file": args.calibration, "machine": calibration.machine, "startup_s": startup},
        "trace": {"per_minute": list(trace.per_minute), "requests": len(requests)},
        "slo": dataclasses.asdict(slo),
        "policies": rows,
        "timelines": timelines,
        "table": table,
    }


def simulate_policy(job: tuple[Any, ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One policy over the trace: its summary row and its per-minute timeline."""
    from sluice.runtime.sim.plan.fleet import Fleet
    from sluice.runtime.sim.plan.report import summarize

    policy, server_args, calibration, timings, routing, cpu_cores, seed, requests, duration, slo, transfer = job
    t0 = time.perf_counter()
    fleet = Fleet(policy, server_args, calibration, timings, routing=routing, cpu_cores=cpu_cores,
                  seed=seed, transfer=transfer)  # fmt: skip
    result = fleet.run(requests, duration)
    row = summarize(result, slo, len(requests))
    row["wall_seconds"] = time.perf_counter() - t0
    row["simulated_seconds_per_wall_second"] = result.end / row["wall_seconds"]
    timeline = {"minutes": result.timeline, "scale_events": [dataclasses.asdict(e) for e in result.scale_events]}
    return row, timeline


def main(ns: argparse.Namespace) -> int:
    try:
        args = PlanArgs(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(PlanArgs)})
        args.validate()
        calibration = Calibration.load(Path(args.calibration))
        refused = None if args.allow_other_cpu else calibration.other_cpu()
        if refused:
            raise ValueError(refused)
        server_args = server_args_from(ns, SCHEDULING_FLAGS)
        began = time.perf_counter()
        doc = run_plan(args, server_args, calibration)
    except ValueError as err:
        print(f"sluice plan: {err}", file=sys.stderr)
        return 2
    print(doc["table"])
    print(f"planned in {time.perf_counter() - began:.0f} s")
    if args.output_file:
        path = Path(args.output_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"results written to {args.output_file}")
    return 0
