"""`--metrics-compat vllm`: the scheduler gauges under the names the Gateway API Inference
Extension's endpoint picker reads, with the same values as the sluice_* gauges.

Oracle: the metric table of the extension's model-server protocol
(gateway-api-inference-extension, docs/proposals/003-model-server-protocol/README.md),
vLLM column, and the labels its EPP parses from `vllm:cache_config_info` and
`vllm:lora_requests_info`; parsed with prometheus_client's own text parser.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.runtime import constants as C
from sluice.runtime.ipc.messages import SchedulerStats
from sluice.runtime.metrics import MetricsCollector

PROTOCOL = {  # protocol metric -> the vLLM name, all gauges
    "TotalQueuedRequests": "vllm:num_requests_waiting",
    "TotalRunningRequests": "vllm:num_requests_running",
    "KVCacheUtilization": "vllm:kv_cache_usage_perc",
}


def families(collector: MetricsCollector) -> dict:
    return {f.name: f for f in text_string_to_metric_families(collector.render().decode())}


def test_the_protocol_gauges_mirror_the_scheduler_under_vllm_names():
    c = MetricsCollector("m", SchedulerStats(max_total_tokens=4096), compat="vllm", page_size=16)
    c.on_stats(SchedulerStats(queue_requests=3, running_requests=5, kv_token_usage=0.25,
                              max_total_tokens=4096))  # fmt: skip
    fams = families(c)
    sluice = {
        "vllm:num_requests_waiting": C.METRIC_QUEUE_REQUESTS,
        "vllm:num_requests_running": C.METRIC_RUNNING_REQUESTS,
        "vllm:kv_cache_usage_perc": C.METRIC_KV_TOKEN_USAGE,
        "vllm:gpu_cache_usage_perc": C.METRIC_KV_TOKEN_USAGE,
    }
    for vllm_name, sluice_name in sluice.items():
        fam = fams[vllm_name]
        assert fam.type == "gauge"
        (sample,) = fam.samples
        assert sample.labels == {"model_name": "m"}
        assert sample.value == fams[sluice_name].samples[0].value
    assert set(PROTOCOL.values()) <= set(fams)
    assert fams["vllm:num_requests_waiting"].samples[0].value == 3


def test_cache_config_and_lora_info_carry_the_labels_the_picker_parses():
    c = MetricsCollector("m", SchedulerStats(max_total_tokens=4096), compat="vllm", page_size=16)
    fams = families(c)
    (config,) = fams["vllm:cache_config_info"].samples
    assert config.labels == {"model_name": "m", "block_size": "16", "num_gpu_blocks": "256"}
    (lora,) = fams["vllm:lora_requests_info"].samples
    assert lora.labels["max_lora"] == "0"
    assert lora.labels["running_lora_adapters"] == lora.labels["waiting_lora_adapters"] == ""


def test_without_the_flag_there_is_no_alias_family_and_unknown_families_are_refused():
    assert not [n for n in families(MetricsCollector("m")) if n.startswith("vllm:")]
    with pytest.raises(ValueError, match="compat"):
        MetricsCollector("m", compat="tgi")
