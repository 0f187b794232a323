"""`--metrics-compat vllm`: the scheduler gauges again under vLLM's names, for readers that
only know those, first of all the Gateway API Inference Extension's endpoint picker (EPP).

The EPP's model-server protocol (gateway-api-inference-extension,
docs/proposals/003-model-server-protocol/README.md, "Metrics Reporting") asks a model
server for these, and its reference EPP reads vLLM's names by default (its flags
`--total-queued-requests-metric`, `--total-running-requests-metric`,
`--kv-cache-usage-percentage-metric`, `--lora-info-metric`, `--cache-info-metric`):

| protocol metric      | type    | vLLM name (what we expose)       | Sluice source             |
|----------------------|---------|----------------------------------|---------------------------|
| TotalQueuedRequests  | gauge   | `vllm:num_requests_waiting`      | `sluice_queue_requests`   |
| TotalRunningRequests | gauge   | `vllm:num_requests_running`      | `sluice_running_requests` |
| KVCacheUtilization   | gauge   | `vllm:kv_cache_usage_perc` (0..1)| `sluice_kv_token_usage`   |
| (older EPPs, <= v0.5)| gauge   | `vllm:gpu_cache_usage_perc`      | `sluice_kv_token_usage`   |
| BlockSize, NumGPUBlocks (optional) | labels | `vllm:cache_config_info{block_size, num_gpu_blocks}` | page size, pool pages |
| LoRA adapters        | labels  | `vllm:lora_requests_info{max_lora, running_lora_adapters, waiting_lora_adapters}` | `--max-loras` (0 without `--enable-lora`), the adapters with running / waiting requests, comma-separated |

Like vLLM, every series carries a `model_name` label. The values are the same
`SchedulerStats` the `sluice_*` gauges show, read at scrape time; nothing is renamed or
removed from the `sluice_*` family (the alias family is additive).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.runtime.metrics.scheduler_mirror import SchedulerMirror

COMPAT_FAMILIES = ("none", "vllm")
VLLM_LABEL_MODEL = "model_name"
VLLM_NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
VLLM_GPU_CACHE_USAGE_PERC = "vllm:gpu_cache_usage_perc"
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"
VLLM_LORA_REQUESTS_INFO = "vllm:lora_requests_info"


class VllmCompatMirror(Collector):
    def __init__(self, mirror: SchedulerMirror, page_size: int) -> None:
        self.mirror = mirror
        self.page_size = max(1, page_size)
        self.started = time.time()

    def collect(self) -> Iterator[Metric]:
        stats = self.mirror.stats
        model = [self.mirror.model]
        label = [VLLM_LABEL_MODEL]
        for name, help_text, value in (
            (VLLM_NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", stats.queue_requests),
            (VLLM_NUM_REQUESTS_RUNNING, "Requests in the running batch.", stats.running_requests),
            (VLLM_KV_CACHE_USAGE_PERC, "KV cache usage, 0..1.", stats.kv_token_usage),
            (VLLM_GPU_CACHE_USAGE_PERC, "KV cache usage, 0..1 (older name).", stats.kv_token_usage),
        ):
            gauge = GaugeMetricFamily(name, help_text, labels=label)
            gauge.add_metric(model, float(value))
            yield gauge
        config = GaugeMetricFamily(
            VLLM_CACHE_CONFIG_INFO, "KV cache configuration (value 1; the labels carry it).",
            labels=[VLLM_LABEL_MODEL, "block_size", "num_gpu_blocks"],
        )  # fmt: skip
        blocks = stats.max_total_tokens // self.page_size
        config.add_metric([*model, str(self.page_size), str(blocks)], 1.0)
        yield config
        lora = GaugeMetricFamily(
            VLLM_LORA_REQUESTS_INFO, "Running and waiting LoRA adapters (the labels); the value "
            "is when the stats were read (seconds since the epoch), as vLLM's.",
            labels=[VLLM_LABEL_MODEL, "max_lora", "running_lora_adapters", "waiting_lora_adapters"],
        )  # fmt: skip
        running = ",".join(sorted(stats.lora_running))
        waiting = ",".join(sorted(stats.lora_waiting))
        lora.add_metric([*model, str(stats.lora_max), running, waiting], time.time())
        yield lora

    def describe(self) -> Iterator[Metric]:
        return self.collect()
