"""`sluice plan`'s fleet: traffic traces, pods that take time to start and drain, the router,
and the autoscalers acting on what Prometheus scraped, all on the virtual clock (costs
chosen, so nothing depends on this machine's speed)."""

from __future__ import annotations

import json

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.cli import main
from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.sim.cost_model import LinearCost
from sluice.runtime.sim.plan import hpa as H
from sluice.runtime.sim.plan.fleet import ClusterTimings, Fleet
from sluice.runtime.sim.plan.policies import PolicySpec, parse_policy
from sluice.runtime.sim.plan.report import Slo, summarize
from sluice.runtime.sim.plan.traffic import (
    RateTrace,
    RequestShape,
    planned_requests,
    poisson_arrivals,
)

FAST_DOWN = H.Behavior(scale_down=H.rules(60, H.DEFAULT_SCALE_DOWN))
SHAPE = RequestShape(input_len=48, input_min=16, output_len=24, output_min=8)


@pytest.fixture(scope="module")
def calibration(tiny_llama_path):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    # 40 ms per forward + 1 ms per position: a replica decodes ~4 requests at ~25 tokens/s each
    return synthetic_calibration(worker, LinearCost(("one", "tokens"), (0.04, 0.001)), 0.001, 0.0005)


@pytest.fixture(scope="module")
def args(tiny_llama_path):
    return server_args(tiny_llama_path, max_running_requests=4, max_total_tokens=4096)


def requests_for(trace: RateTrace, calibration, seed: int = 1):
    arrivals = poisson_arrivals(trace, seed)
    return planned_requests(arrivals, SHAPE, calibration.model.vocab_size, set(calibration.model.eos_token_ids), seed)


def run(policy, args, calibration, trace, **kw):
    timings = ClusterTimings(startup_s=kw.pop("startup_s", 20.0), pending_s=2.0, drain_timeout_s=kw.pop("drain_s", 30.0))
    fleet = Fleet(policy, args, calibration, timings, routing=kw.pop("routing", "round-robin"), **kw)
    return fleet.run(requests_for(trace, calibration), trace.duration_s)


def test_poisson_arrivals_follow_the_rate_of_each_minute():
    trace = RateTrace((2.0, 0.0, 6.0))
    times = poisson_arrivals(trace, seed=4)
    per_minute = [sum(1 for t in times if m * 60 <= t < (m + 1) * 60) for m in range(3)]
    assert per_minute[1] == 0
    assert 80 <= per_minute[0] <= 160 and 280 <= per_minute[2] <= 440  # 120 and 360 expected
    assert times == sorted(times) and times == poisson_arrivals(trace, seed=4)


def test_trace_files_and_generators(tmp_path):
    (tmp_path / "a.txt").write_text("# rates\nminute,rate\n0,1.5\n1,2\n2,0\n")
    assert RateTrace.from_file(tmp_path / "a.txt").per_minute == (1.5, 2.0, 0.0)
    (tmp_path / "b.json").write_text("[1, 2.5]")
    assert RateTrace.from_file(tmp_path / "b.json").per_minute == (1.0, 2.5)
    bursty = RateTrace.bursty(60, 0.5, 4.0, burst_minutes=5, bursts=3, seed=1)
    assert bursty.per_minute.count(4.0) == 15 and bursty.per_minute[0] == 0.5
    day = RateTrace.diurnal(1440, peak=10.0, trough=1.0)
    assert max(day.per_minute) == pytest.approx(10.0, abs=1e-3) and min(day.per_minute) == pytest.approx(1.0, abs=1e-3)
    with pytest.raises(ValueError):
        RateTrace((1.0, -2.0))


def test_requests_have_the_shapes_lengths_and_never_eos(calibration):
    reqs = requests_for(RateTrace((3.0,)), calibration)
    eos = set(calibration.model.eos_token_ids)
    assert all(16 <= len(r.input_ids) <= 48 and 8 <= r.max_new_tokens <= 24 for r in reqs)
    assert not any(eos & set(r.input_ids) for r in reqs)


def test_a_static_fleet_round_robins_and_counts_its_replica_hours(args, calibration):
    result = run(parse_policy("static:2", 1, 4, H.Behavior()), args, calibration, RateTrace((1.0, 1.0)))
    sent = [p.sent for p in result.pods]
    assert len(result.pods) == 2 and abs(sent[0] - sent[1]) <= 1
    row = summarize(result, Slo(2.0, 0.25), sum(sent))
    assert row["failed"] == 0 and row["scale_events"] == 0
    assert row["replica_hours"] == pytest.approx(2 * result.end / 3600)


def test_the_queue_depth_hpa_scales_up_in_a_burst_and_down_after_its_window(args, calibration):
    trace = RateTrace((0.5, 6.0, 6.0, 6.0, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2))
    policy = PolicySpec("hpa:queueDepth=2", "hpa", 1, 4, metrics=(("queueDepth", 2.0),), behavior=FAST_DOWN)
    result = run(policy, args, calibration, trace)
    ups = [e for e in result.scale_events if e.after > e.before]
    downs = [e for e in result.scale_events if e.after < e.before]
    assert ups and 60 <= ups[0].at <= 120  # the burst began at minute 1
    assert downs and downs[-1].at > 240 and downs[-1].after == 1  # back to one after the burst
    assert max(e.after for e in ups) > 1
    # a new pod takes its requests only once it is ready: created + pending + start-up
    late = [p for p in result.pods if p.created > 0]
    assert late and all(p.ready_at == pytest.approx(p.created + 22.0) for p in late)
    first = {tr.rid: tr.arrival for tr in result.traces}
    for p in late:
        arrivals = [first[rid] for rid in p.replica.traces]
        assert not arrivals or min(arrivals) >= p.ready_at
    assert not result.failed  # drained pods finished everything they had


@pytest.mark.parametrize("drain_s, lost", [(600.0, False), (0.5, True)])
def test_a_removed_pod_drains_what_it_holds_within_its_drain_time(args, calibration, drain_s, lost):
    from sluice.runtime.sim.plan.traffic import PlannedRequest

    timings = ClusterTimings(startup_s=5.0, drain_timeout_s=drain_s)
    fleet = Fleet(parse_policy("static:2", 1, 4, H.Behavior()), args, calibration, timings, routing="round-robin")
    for i in range(4):  # two long requests on each pod
        fleet._route(0.0, PlannedRequest(0.0, tuple(range(10 + 40 * i, 40 + 40 * i)), 200), f"r{i}")
    fleet._advance(1.0)
    fleet._scale_to(1.0, 1)
    (gone,) = [p for p in fleet.pods if p.deleting_since is not None]
    assert gone.sent == 2 and not gone.ready(1.0)  # out of the router at once
    for t in range(2, 60):
        fleet._advance(float(t))
    assert gone.gone_at is not None
    assert bool(fleet.failed) == lost
    if lost:
        assert set(fleet.failed) == set(gone.replica.traces)  # both of its requests
        assert gone.gone_at == pytest.approx(1.5, abs=0.2)


def test_the_saturation_policy_scales_with_the_recorded_count(args, calibration):
    trace = RateTrace((0.3, 5.0, 5.0, 5.0, 0.3, 0.3, 0.3, 0.3))
    sat = parse_policy("saturation:queue=2,queueSpare=1", 1, 4, FAST_DOWN)
    result = run(sat, args, calibration, trace)
    assert any(e.after > e.before for e in result.scale_events)
    # scale-ups one pod at a time: the rule asks for N + 1 of the pods that report
    assert all(e.after - e.before <= 1 for e in result.scale_events if e.after > e.before)


def test_cpu_utilisation_hpa_sees_busy_pods(args, calibration):
    trace = RateTrace((0.3, 5.0, 5.0, 5.0))
    result = run(parse_policy("cpu:50", 1, 4, H.Behavior()), args, calibration, trace)
    assert any(e.after > e.before for e in result.scale_events)


def test_the_same_plan_twice_is_the_same(args, calibration):
    trace = RateTrace((0.5, 4.0, 0.5))
    policy = PolicySpec("q", "hpa", 1, 3, metrics=(("queueDepth", 2.0),))
    a, b = (summarize(run(policy, args, calibration, trace, routing="random"), Slo(1.0, 0.2), 0) for _ in range(2))
    assert a == b


def test_policies_parse_or_are_refused():
    assert parse_policy("hpa:queueDepth=4,kvTokenUsage=0.7", 1, 5, H.Behavior()).metrics == (
        ("queueDepth", 4.0), ("kvTokenUsage", 0.7))
    assert parse_policy("static:3", 1, 5, H.Behavior()).replicas == 3
    for bad in ("hpa", "hpa:gpu=1", "saturation:nope=1", "magic", "hpa:kvTokenUsage=2"):
        with pytest.raises(ValueError):
            parse_policy(bad, 1, 5, H.Behavior())


def test_the_plan_command_writes_a_row_per_policy(calibration, tmp_path, tiny_llama_path):
    cal = tmp_path / "cal.json"
    calibration.save(cal)
    out = tmp_path / "plan.json"
    argv = ["plan", "--calibration", str(cal), "--traffic", "bursty", "--duration-minutes", "4",
            "--bursts", "1", "--burst-minutes", "1", "--base-rate", "0.3", "--peak-rate", "3",
            "--input-len", "48", "--input-min", "16", "--output-len", "24", "--output-min", "8",
            "--policy", "hpa:queueDepth=2", "static:2", "--max-running-requests", "4",
            "--max-total-tokens", "4096"]  # fmt: skip
    code = main([*argv, "--output-file", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert [r["policy"] for r in doc["policies"]] == ["hpa:queueDepth=2", "static:2"]
    for r in doc["policies"]:
        assert 0 <= r["slo_attainment"] <= 1 and r["replica_hours"] > 0
    # the same with both policies in parallel processes
    assert main([*argv, "--jobs", "2", "--output-file", str(tmp_path / "jobs.json")]) == 0
    again = json.loads((tmp_path / "jobs.json").read_text())

    def same(rows):
        return [{k: v for k, v in r.items() if "wall" not in k} for r in rows]

    assert same(again["policies"]) == same(doc["policies"])
    assert main(["plan", "--calibration", str(cal), "--policy", "nope"]) == 2


def test_a_p_d_fleet_counts_two_pods_per_replica_and_its_decode_pods_compute_no_prompt(
    args, calibration
):
    from sluice.runtime.sim.pd import SimPDPair, TransferCost

    cost = TransferCost(calibration.model.bytes_per_token, 10.0, 0.0005)
    trace = RateTrace((1.0, 1.0))
    result = run(
        parse_policy("static:1", 1, 4, H.Behavior()), args, calibration, trace, transfer=cost
    )
    (pod,) = result.pods
    assert isinstance(pod.replica, SimPDPair) and result.pods_per_replica == 2
    row = summarize(result, Slo(2.0, 0.25), pod.sent)
    assert row["failed"] == 0 and pod.sent > 0
    assert row["replica_hours"] == pytest.approx(2 * result.end / 3600)  # two pods
    assert pod.replica.decode.stats().computed_prompt_tokens_total == 0
    assert pod.replica.prefill.stats().disagg_sent_tokens_total > 0
    pod.replica.check_integrity()


def test_the_plan_command_takes_a_p_d_topology(calibration, tmp_path):
    cal = tmp_path / "cal.json"
    calibration.save(cal)
    out = tmp_path / "plan.json"
    argv = ["plan", "--calibration", str(cal), "--traffic", "constant", "--duration-minutes", "2",
            "--base-rate", "1", "--input-len", "48", "--input-min", "16", "--output-len", "24",
            "--output-min", "8", "--policy", "static:1", "--max-running-requests", "4",
            "--max-total-tokens", "4096", "--pd-disaggregation", "--output-file", str(out)]  # fmt: skip
    assert main(argv) == 0
    (row,) = json.loads(out.read_text())["policies"]
    assert row["failed"] == 0 and row["replica_hours"] > 0
    assert main(["plan", "--calibration", str(cal), "--pd-transfer-gbps", "-1"]) == 2
