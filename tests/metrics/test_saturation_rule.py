"""The saturation policy's recording rule (monitoring/prometheus/saturation.yaml): the shipped
file is the generator's output with the project's defaults, and a real Prometheus engine
(`promtool test rules`) evaluating it over random fleets records exactly the replica count
the simulator's Python model (`sluice.runtime.sim.plan.saturation`) computes from the same
samples. So what `sluice plan` simulates is what the cluster runs."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import yaml
from metrics_testkit import MONITORING

from sluice.runtime import constants as C
from sluice.runtime.sim.plan.saturation import SaturationConfig, desired_replicas, peaks
from sluice.runtime.sim.plan.saturation_rule import render

RULE = MONITORING / "prometheus" / "saturation.yaml"
STEP_S = 7  # sample spacing: no sample falls on the 1m window's edge at the evaluation times
EVAL_TIMES = (120, 240)


def test_the_shipped_rule_is_the_generators_output_with_the_defaults():
    assert RULE.read_text() == render(), "regenerate: python -m sluice.runtime.sim.plan.saturation_rule"
    group = yaml.safe_load(RULE.read_text())["groups"][0]
    assert group["rules"][-1]["record"] == C.SATURATION_RECORDED_METRIC


def test_the_rule_passes_promtool_check(prometheus_tools):
    done = subprocess.run([prometheus_tools.promtool, "check", "rules", str(RULE)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _near_a_boundary(pods, config: SaturationConfig) -> bool:
    """Cases where a float rounding difference could flip a comparison: skipped."""
    free = [p for p in pods if p.kv < config.kv_threshold and p.queue < config.queue_threshold]
    checks = [p.kv - config.kv_threshold for p in pods] + [p.queue - config.queue_threshold for p in pods]
    if free:
        checks.append(sum(config.kv_threshold - p.kv for p in free) / len(free) - config.kv_spare_trigger)
        checks.append(sum(config.queue_threshold - p.queue for p in free) / len(free) - config.queue_spare_trigger)
        if len(free) >= 2:
            rest = len(free) - 1
            checks.append(config.kv_threshold - sum(p.kv for p in free) / rest - config.kv_spare_trigger)
            checks.append(config.queue_threshold - sum(p.queue for p in free) / rest - config.queue_spare_trigger)
    return any(abs(c) < 1e-6 for c in checks)


def random_fleet(rng: random.Random, services: int) -> dict[str, dict[str, list[tuple[float, float, float]]]]:
    """service -> pod -> (t, kv, queue) samples; some pods start late or stop early."""
    fleet = {}
    for s in range(services):
        pods = {}
        load = rng.choice([0.1, 0.4, 0.7, 0.95])  # how busy this service is
        for _ in range(rng.randint(1, 5)):
            name = f"svc{s}-{rng.randrange(16**9):09x}-{rng.randrange(36**5):05d}"
            first, last = rng.choice([(0, 300), (0, 300), (150, 300), (0, 100)])
            series = []
            for t in range(0, 300, STEP_S):
                if first <= t <= last:
                    kv = min(1.0, max(0.0, rng.gauss(load, 0.15)))
                    queue = float(max(0, round(rng.gauss(8 * load - 2, 2))))
                    series.append((float(t), round(kv, 4), queue))
            pods[name] = series
        fleet[f"svc{s}"] = pods
    return fleet


def promtool_case(fleet, rule_path: Path) -> tuple[str, list[str]]:
    """A promtool test file whose expected samples are the Python model's answers (or
    None when a fleet sits on a comparison's boundary)."""
    config = SaturationConfig()
    series = []
    for pods in fleet.values():
        for pod, samples in pods.items():
            by_t = {int(t): (kv, q) for t, kv, q in samples}
            kv_vals, q_vals = [], []
            for t in range(0, 300, STEP_S):
                if t in by_t:
                    kv_vals.append(str(by_t[t][0]))
                    q_vals.append(str(by_t[t][1]))
                else:
                    kv_vals.append("_")
                    q_vals.append("_")
            labels = f'namespace="ns",pod="{pod}",model="m"'
            series.append({"series": f"{C.METRIC_KV_TOKEN_USAGE}{{{labels}}}", "values": " ".join(kv_vals)})
            series.append({"series": f"{C.METRIC_QUEUE_REQUESTS}{{{labels}}}", "values": " ".join(q_vals)})
    tests = []
    described = []
    for at in EVAL_TIMES:
        expected = []
        for name, pods in fleet.items():
            found = peaks(pods, float(at), config.window_s)
            if _near_a_boundary(found, config):
                return "", []
            d = desired_replicas(found, config)
            if d is not None:
                expected.append({"labels": f'{C.SATURATION_RECORDED_METRIC}{{namespace="ns",{C.SATURATION_SERVICE_LABEL}="{name}"}}',
                                 "value": d})  # fmt: skip
                described.append(f"t={at} {name}: {len(found)} pods -> {d}")
        tests.append({"expr": C.SATURATION_RECORDED_METRIC, "eval_time": f"{at}s", "exp_samples": expected})
    doc = {
        "rule_files": [str(rule_path)],
        "evaluation_interval": C.SATURATION_RULE_INTERVAL,
        "tests": [{"interval": f"{STEP_S}s", "input_series": series, "promql_expr_test": tests}],
    }
    return yaml.safe_dump(doc, sort_keys=False), described


@pytest.mark.parametrize("seed", range(6))
def test_prometheus_records_what_the_simulator_computes(prometheus_tools, tmp_path, seed):
    rng = random.Random(seed)
    text, described = "", []
    while not text:
        text, described = promtool_case(random_fleet(rng, services=4), RULE)
    case = tmp_path / "case.yaml"
    case.write_text(text)
    done = subprocess.run([prometheus_tools.promtool, "test", "rules", str(case)], capture_output=True, text=True)
    assert done.returncode == 0, "\n".join(described) + "\n" + done.stdout + done.stderr


def test_the_decisions_cover_up_down_and_hold():
    """The random fleets above exercise every branch of the rule (a guard on the test)."""
    config = SaturationConfig()
    seen = set()
    for seed in range(6):
        rng = random.Random(seed)
        fleet = random_fleet(rng, services=4)
        for pods in fleet.values():
            for at in EVAL_TIMES:
                found = peaks(pods, float(at), config.window_s)
                d = desired_replicas(found, config)
                if d is not None:
                    seen.add((d > len(found)) - (d < len(found)))
    assert seen == {-1, 0, 1}
