"""`trace_compare` on two schedule traces written by the simulator's own trace writer (the
layout `sluice serve --schedule-trace` writes): one replica whose forwards cost 1.5x the
other's, on the same arrivals. The comparison must find the same batches tick by tick,
the forward 1.5x the cost model on every kind of tick, and the arrivals where they were."""

from __future__ import annotations

import dataclasses

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.sim.cost_model import LinearCost, StepCostModel
from sluice.runtime.sim.replica import SimReplica, SimRequest
from sluice.runtime.sim.trace_compare import Trace, compare, format_comparison, main

BASE = LinearCost(("one", "tokens"), (0.02, 0.0001))
OFFSETS = (0.0, 1.0, 2.0, 2.0, 2.0, 2.0)  # three alone to an idle server, then three at once


@pytest.fixture(scope="module")
def calibration(tiny_llama_path):
    worker = ModelWorker(server_args(tiny_llama_path), tiny_llama_path)
    return synthetic_calibration(worker, BASE, 0.001, 0.0005)


def run(tiny_llama_path, calibration, path) -> None:
    r = SimReplica(
        server_args(tiny_llama_path, disable_overlap_schedule=True),
        calibration,
        trace_path=str(path),
    )
    r.submit(SimRequest("warmup-0", list(range(3, 20)), 2, arrival=0.0))
    r.run_to_completion()
    start = r.clock.now + 0.5
    for i, offset in enumerate(OFFSETS):
        r.submit(SimRequest(f"r{i}", list(range(5 + i, 45 + 7 * i)), 6, arrival=start + offset))
    r.run_to_completion()
    r.trace.close()


def test_the_comparison_finds_the_slower_forward_on_the_same_batches(
    tiny_llama_path, calibration, tmp_path
):
    slow = LinearCost(BASE.terms, tuple(1.5 * c for c in BASE.coef))
    loop = calibration.costs.loop(False)
    slower = dataclasses.replace(
        calibration, costs=StepCostModel({"normal": dataclasses.replace(loop, forward=slow)})
    )
    run(tiny_llama_path, slower, tmp_path / "real.jsonl")
    run(tiny_llama_path, calibration, tmp_path / "sim.jsonl")
    real, sim = Trace.read(tmp_path / "real.jsonl", 1), Trace.read(tmp_path / "sim.jsonl", 1)
    assert [a for a, _ in real.arrivals] == pytest.approx(OFFSETS)
    c = compare(real, sim, loop)
    assert (
        c["same_batches_from_start"]
        == len(real.forwards)
        == len(sim.forwards)
        == c["real"]["ticks"]
    )
    for kind in ("decode", "prefill"):
        assert c["real"]["by_kind"][kind]["ticks"] > 0
        assert c["real"]["by_kind"][kind]["real_over_model_forward"] == pytest.approx(1.5)
        assert c["real"]["by_kind"][kind]["mean_host_ms"] == pytest.approx(
            c["real"]["by_kind"][kind]["model_host_ms"]
        )
    assert c["real"]["forward_s"] == pytest.approx(1.5 * c["sim"]["forward_s"])
    assert "| decode |" in format_comparison(c)


def test_the_command_refuses_a_trace_without_requests(tmp_path, capsys):
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert main([str(empty), str(empty)]) == 2
    assert "no arrivals" in capsys.readouterr().err
