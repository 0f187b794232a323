"""The simulator runs the real scheduler: on the same arrivals, a simulated replica launches
exactly the batches the real scheduler over the real (tiny) model launches, row by row,
in both loops, through chunking, mixed batches, the radix cache, slot limits, policies
and retraction. Nothing here depends on machine speed: the oracle is the real engine's
sequence of `ForwardInput` rows.

How arrivals line up: the simulation is run first and records, for each request, how many
scheduler steps had run when it was handed over; the real scheduler then gets each request
before the same step.
"""

from __future__ import annotations

import random

import pytest
from sim_testkit import synthetic_calibration

from sluice.runtime.ipc.messages import SamplingParams, TokenizedGenerateReq
from sluice.runtime.sim.cost_model import LinearCost
from sluice.runtime.sim.replica import SimReplica, SimRequest

rng = random.Random(7)


def prompt(n: int, prefix: list[int] | None = None) -> list[int]:
    own = [rng.randrange(3, 500) for _ in range(n - len(prefix or []))]
    return (prefix or []) + own


SHARED = prompt(40)

# (name, server flags, requests: (rid, prompt, max_new_tokens, arrival seconds))
SCENARIOS = [
    (
        "chunked-mixed-radix",
        {"chunked_prefill_size": 32, "max_prefill_tokens": 64, "max_running_requests": 4},
        [("a", prompt(90), 12, 0.0), ("b", prompt(20), 30, 0.0), ("c", prompt(50, SHARED), 9, 0.0),
         ("d", prompt(60, SHARED), 7, 0.05), ("e", prompt(10), 20, 0.2), ("f", prompt(45, SHARED), 5, 0.4),
         ("g", prompt(33), 3, 0.41), ("h", prompt(70), 15, 0.9)],
    ),
    (
        "retraction",
        {"max_total_tokens": 128, "max_running_requests": 8, "disable_radix_cache": True},
        [(f"r{i}", prompt(4 + i), 28, 0.0) for i in range(6)] + [("late", prompt(9), 10, 0.3)],
    ),
    (
        "prefill-first-lpm",
        {"disable_mixed_chunk": True, "max_prefill_streak": 2, "schedule_policy": "lpm",
         "chunked_prefill_size": 24, "max_running_requests": 6},
        [("p1", prompt(30, SHARED), 6, 0.0), ("p2", prompt(41), 8, 0.0), ("p3", prompt(52, SHARED), 6, 0.0),
         ("p4", prompt(25), 12, 0.1), ("p5", prompt(44, SHARED), 4, 0.1), ("p6", prompt(18), 10, 0.25)],
    ),
    (
        "page-size-4",
        {"page_size": 4, "chunked_prefill_size": 16, "max_running_requests": 3},
        [("x", prompt(37, SHARED), 9, 0.0), ("y", prompt(45, SHARED), 6, 0.0), ("z", prompt(13), 11, 0.02),
         ("w", prompt(29), 5, 0.3)],
    ),
]


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
@pytest.mark.parametrize("name, flags, requests", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_simulated_batches_are_the_real_schedulers(real_scheduler, overlap, name, flags, requests):
    real, worker = real_scheduler(disable_overlap_schedule=not overlap, **flags)
    forward = LinearCost(("one", "tokens"), (0.02, 0.0005))
    sim = SimReplica(worker.args, synthetic_calibration(worker, forward), record_launches=True)
    for rid, ids, n, at in requests:
        sim.submit(SimRequest(rid, ids, n, at))
    sim.run_to_completion()
    sim.check_integrity()
    assert all(sim.traces[rid].output_tokens == n for rid, _, n, _ in requests)

    # the real engine, each request handed over before the step the simulation gave it
    by_step: dict[int, list[tuple[str, list[int], int]]] = {}
    for rid, ids, n, _ in requests:
        by_step.setdefault(sim.delivered_at_step[rid], []).append((rid, ids, n))
    s = real.scheduler
    steps = 0
    outputs: dict[str, int] = {}
    while by_step or s.has_work:
        for rid, ids, n in by_step.pop(steps, []):
            params = SamplingParams(max_new_tokens=n, temperature=0.0, ignore_eos=True)
            s.handle(TokenizedGenerateReq(rid, ids, params, 1.0))
        if not s.has_work:  # idle: the simulation's clock jumped to the next arrival
            assert min(by_step) == steps
            continue
        real.step()
        steps += 1
        out = s.take_output()
        for u in out.updates if out else []:
            outputs[u.rid] = outputs.get(u.rid, 0) + len(u.new_token_ids)
    s.check_integrity()
    assert outputs == {rid: n for rid, _, n, _ in requests}

    simulated = [tuple(rec.rows) for rec in sim.executor.launches]
    assert len(simulated) == len(real.launches)
    assert simulated == real.launches
    if name == "retraction":
        assert s.counters.retractions_total > 0
        assert sim.scheduler.counters.retractions_total == s.counters.retractions_total
    if name in ("chunked-mixed-radix", "page-size-4"):
        assert sim.scheduler.counters.cached_prompt_tokens == s.counters.cached_prompt_tokens > 0
