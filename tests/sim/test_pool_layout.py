"""The simulator sizes a replica's KV pool and context as `ModelWorker` does (the oracle:
the real worker built with the same flags)."""

from __future__ import annotations

import pytest
from sim_testkit import server_args, synthetic_calibration
from tiny_windowed import ALL_SLIDING_FAMILY, make_tiny_windowed

from sluice.runtime.engine.model_worker import ModelWorker
from sluice.runtime.engine.worker_setup import KEY_ONLY_FULL_POOL_MAX_TOKENS, size_kv_pool
from sluice.runtime.memory.window_pages import window_pool_floor
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


@pytest.mark.parametrize(
    "flags",
    [
        {"max_total_tokens": 0, "cpu_kv_cache_gib": 0.01, "max_running_requests": 4,
         "max_prefill_tokens": 64},
        {"max_total_tokens": 2048, "swa_full_tokens_ratio": 0.5, "page_size": 4,
         "max_running_requests": 4, "max_prefill_tokens": 64},
        {"max_total_tokens": 0, "cpu_kv_cache_gib": 0.01, "disable_hybrid_swa_memory": True},
    ],
)  # fmt: skip
def test_a_windowed_models_two_pools_are_the_workers(tmp_path_factory, flags):
    folder = make_tiny_windowed(tmp_path_factory.mktemp("gemma3"), "gemma3")
    args = server_args(folder, **flags)
    worker = ModelWorker(args, folder)
    calibration = synthetic_calibration(ModelWorker(server_args(folder), folder))
    assert pool_layout(args, calibration) == worker.pool
    assert (worker.pool.window_tokens > 0) != bool(flags.get("disable_hybrid_swa_memory"))


def test_a_window_pool_below_what_running_windows_need_is_refused(tmp_path):
    folder = make_tiny_windowed(tmp_path / "gemma3", "gemma3")
    args = server_args(folder, max_total_tokens=2048, swa_full_tokens_ratio=0.05,
                       max_running_requests=8, max_prefill_tokens=64)  # fmt: skip
    with pytest.raises(ValueError, match=r"gives the sliding-window layers 102 KV tokens; 8 "
                       r"running requests' windows of 12 and one prefill batch need 168"):  # fmt: skip
        ModelWorker(args, folder)


@pytest.mark.parametrize(
    "flags",
    [
        {"max_total_tokens": 0, "cpu_kv_cache_gib": 0.01, "max_running_requests": 4,
         "max_prefill_tokens": 64},
        {"max_total_tokens": 256, "page_size": 4, "max_running_requests": 4,
         "max_prefill_tokens": 64},
        # below what 8 running windows and a prefill batch need: one pool, every token kept
        {"max_total_tokens": 96, "page_size": 4, "max_running_requests": 8,
         "max_prefill_tokens": 64},
        {"max_total_tokens": 0, "cpu_kv_cache_gib": 0.01, "disable_hybrid_swa_memory": True},
    ],
)  # fmt: skip
def test_when_every_layer_slides_the_window_pool_holds_all_the_kv(tmp_path_factory, flags):
    folder = make_tiny_windowed(tmp_path_factory.mktemp("mistral"), ALL_SLIDING_FAMILY)
    args = server_args(folder, **flags)
    worker = ModelWorker(args, folder)
    calibration = synthetic_calibration(ModelWorker(server_args(folder), folder))
    assert pool_layout(args, calibration) == worker.pool
    layers = set(range(worker.model_config.num_hidden_layers))
    budget = size_kv_pool(args, "cpu", worker.kv.bytes_per_token + (
        worker.window.kv.bytes_per_token if worker.window is not None else 0))
    page, pool = args.page_size, worker.pool
    floor = window_pool_floor(args.max_running_requests, 12, page, args.max_prefill_tokens)
    if args.disable_hybrid_swa_memory or budget < floor:
        assert (pool.window_tokens, pool.window_holds_all, worker.window) == (0, False, None)
        assert worker.kv.layers == layers and pool.total_tokens == budget // page * page
        return
    assert pool.window_holds_all and pool.window_tokens == budget // page * page
    assert worker.kv.total_bytes == 0 and worker.window.kv.layers == layers
    keys = args.max_running_requests * (pool.model_context_len + page)
    keys = max(min(keys, KEY_ONLY_FULL_POOL_MAX_TOKENS), pool.window_tokens)
    assert pool.total_tokens == keys // page * page
    assert pool.context_len == pool.model_context_len  # no K/V in the full pool: no clipping


def test_a_ratio_means_nothing_when_every_layer_slides(tmp_path):
    folder = make_tiny_windowed(tmp_path / "mistral", ALL_SLIDING_FAMILY)
    args = server_args(folder, max_total_tokens=2048, swa_full_tokens_ratio=0.5)
    with pytest.raises(ValueError, match="every layer of this model slides"):
        ModelWorker(args, folder)
