"""The simulator sizes a replica's KV pool and context as `ModelWorker` does (the oracle:
the real worker built with the same flags)."""

from __future__ import annotations

import pytest
from sim_testkit import server_args, synthetic_calibration

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.sim.replica import pool_layout


@pytest.mark.parametrize(
    "flags",
    [
        {"max_total_tokens": 4096},
        {"max_total_tokens": 1000, "page_size": 16},
        {"max_total_tokens": 0, "cpu_kv_cache_gib": 0.002, "page_size": 4},
        {"max_total_tokens": 3000, "max_context_len": 300, "max_running_requests": 3},
        {"max_total_tokens": 200},  # the pool clips the context
    ],
)
def test_pool_layout_is_the_workers(tiny_llama_path, flags):
    args = server_args(tiny_llama_path, **flags)
    worker = ModelWorker(args, tiny_llama_path)
    calibration = synthetic_calibration(ModelWorker(server_args(tiny_llama_path), tiny_llama_path))
    assert pool_layout(args, calibration) == worker.pool
