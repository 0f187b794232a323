"""Every tunable of `sluice serve`, in one place.

`ServerArgs` is a frozen dataclass built once from the command line and handed down; no
component reads flags from globals or the environment. Each field's metadata carries its
one-line help text, and the argparse parser is generated from the fields, so a flag is
declared exactly once.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass

from sluice.runtime.constants import (
    ATTENTION_BACKENDS,
    BUNDLED_MODEL_NAME,
    BUNDLED_MODELS,
    DEFAULT_HOST,
    DEFAULT_PORT,
    DISAGG_DEFAULT_BOOTSTRAP_PORT,
    DISAGG_MODES,
    DISAGG_TRANSFER_BACKENDS,
    DTYPES,
    ENV_API_KEY,
    FLAG_DRAIN_TIMEOUT,
    FLAG_MAX_QUEUED_REQUESTS,
    FLAG_REQUEST_TIMEOUT,
    FLAG_SCHEDULER_HEARTBEAT_TIMEOUT,
    FLAG_STARTUP_TIMEOUT,
    FLAG_TENSOR_PARALLEL_SIZE,
    FLAG_WATCHDOG_TIMEOUT,
    HARMONY_PARSER,
    KV_CACHE_DTYPES,
    LIVE_PATH,
    QUANTIZATIONS,
    REASONING_PARSERS,
    SCHEDULE_POLICIES,
    TOOL_CALL_PARSERS,
)
from sluice.runtime.dataclass_cli import add_flags, option

# what the auto (0) sizes are on the CPU
CPU_AUTO_SIZES = {"max_running_requests": 64, "chunked_prefill_size": 2048, "cuda_graph_max_bs": 160}


@dataclass(frozen=True)
class ServerArgs:
    model: str = option(
        BUNDLED_MODEL_NAME,
        "Hugging Face model folder, GGUF file, or a bundled model's name "
        f"({', '.join(repr(n) for n in BUNDLED_MODELS)}).",
    )
    served_model_name: str = option("", "Model name reported by /v1/models (default: derived).")
    host: str = option(DEFAULT_HOST, "Address the HTTP server binds.")
    port: int = option(DEFAULT_PORT, "Port the HTTP server listens on.")
    device: str = option("auto", "Device for the model: cpu, cuda or auto.", ("auto", "cpu", "cuda"))
    dtype: str = option(
        "auto", "Weight and activation dtype (auto: bf16 on a GPU and on CPUs with native bf16, "
        "avx512_bf16 or amx_bf16; else fp32).", DTYPES,
    )
    kv_cache_dtype: str = option(
        "auto", "KV cache dtype (auto: the model dtype); bfloat16 halves the attention traffic.",
        KV_CACHE_DTYPES,
    )
    quantization: str = option(
        "none", "w8a8: int8 weights per channel and dynamic int8 activations per token "
        "(torchao's scheme, torch's int8 GEMM; CPU only); w8a16: int8 weights with a scale "
        "per row and group of 32 inputs, bf16 activations (packed in AMX tiles at load and "
        "widened by the AMX linear as it reads them; CPUs with AMX-BF16, --dtype bfloat16). "
        "lm_head stays unquantized.",
        QUANTIZATIONS,
    )
    page_size: int = option(1, "Tokens per KV cache page.")
    max_total_tokens: int = option(0, "KV pool size in tokens (0: derive from the memory budget).")
    cpu_kv_cache_gib: float = option(1.0, "KV pool budget in GiB on the CPU when --max-total-tokens is 0.")
    mem_fraction_static: float = option(
        0.85, "Fraction of GPU memory for weights plus KV pool (GPU only)."
    )
    max_running_requests: int = option(
        0, "Request slots: most requests decoding at once (0: auto; on a GPU from the KV pool, "
        "2048..4096 as SGLang; 64 on the CPU)."
    )
    max_prefill_tokens: int = option(8192, "Most prompt tokens admitted into one prefill batch.")
    disable_hybrid_swa_memory: bool = option(
        False, "Keep every token's K/V in sliding-window layers too (Gemma 2/3, gpt-oss, and "
        "models where every layer slides, such as Mistral 7B v0.1); by default those layers "
        "keep only their window, in a pool of their own."
    )
    swa_full_tokens_ratio: float = option(
        0.0, "Sliding-window layers' pool, as a fraction of the full layers' pool in tokens "
        "(0: sized from the model: every running request's window plus one prefill batch; "
        "refused for a model where every layer slides, whose window pool is its whole pool)."
    )
    chunked_prefill_size: int = option(
        0, "Longest prompt piece prefilled in one tick; longer prompts are chunked (-1: off; "
        "0: auto, by GPU memory as SGLang: 8192 on an 80-160 GiB GPU; 2048 on the CPU)."
    )
    max_context_len: int = option(0, "Context length limit (0: the model's own).")
    schedule_policy: str = option("fcfs", "Order in which waiting requests are admitted.", SCHEDULE_POLICIES)
    retraction_policy: str = option(
        "length", "Which running requests to retract first when the KV pool runs out "
        "(length: fewest generated tokens, then longest prompt; newest: latest arrival).",
        ("length", "newest"),
    )
    init_new_token_ratio: float = option(
        0.7, "Initial share of max_new_tokens a running request is expected to still use."
    )
    schedule_conservativeness: float = option(
        1.0, "Scales --init-new-token-ratio: >1 admits fewer requests (fewer retractions)."
    )
    disable_radix_cache: bool = option(False, "Turn off prefix sharing through the radix cache.")
    in_batch_prefix_check_threshold: int = option(
        32, "lpm: below this cached-prefix length a request is checked for in-batch sharing."
    )
    in_batch_prefix_deprioritize_threshold: int = option(
        32, "lpm: a request sharing at least this many tokens with an earlier one waits a tick."
    )
    disable_mixed_chunk: bool = option(
        False, "Do not mix decodes into prefill batches: prefill ticks run alone, and running "
        "requests wait up to --max-prefill-streak ticks for their next token.",
    )
    max_prefill_streak: int = option(
        4, "Without mixed chunks: prefill-only ticks in a row before the running requests get "
        "a decode tick (a running request gets a token at least every N+1 ticks).",
    )
    disable_overlap_schedule: bool = option(
        False, "Use the normal loop: process each batch's result before scheduling the next.",
    )
    enable_overlap_schedule: bool = option(
        False, "Use the overlap loop on the CPU too. By default the overlap loop runs on a GPU "
        "and the normal loop on the CPU, where the forward thread and the scheduler compete for "
        "the same cores (measured slower there). --disable-overlap-schedule wins over this.",
    )
    log_tick_timing: float = option(
        0.0, "Every this many seconds, log where scheduler time went per tick (0: off).",
    )
    schedule_trace: str = option(
        "", "Write every request the scheduler receives and every forward it launches to this "
        "file (JSON lines, the layout `sluice simulate --schedule-trace` writes) for comparing "
        "the simulator with this server tick by tick.",
    )
    enable_deterministic_inference: bool = option(
        False, "Batch-invariant kernels, guaranteed: a request's tokens do not depend on its "
        "batch (retraction, chunking, caching and concurrency cannot change an output). bf16 "
        "on the CPU: the default compiled kernels, which already are (refuses to start "
        "without them); fp32 and CUDA: padded row counts and torch batch-invariant "
        "attention, several times slower.",
    )
    tensor_parallel_size: int = option(
        1, "Ranks one model replica is sharded over: one scheduler + model worker process per "
        "rank (one GPU each on CUDA, NCCL; processes sharing the cores on the CPU, gloo).",
    )
    dist_init_addr: str = option(
        "", "host:port where the tensor-parallel ranks meet (node 0's address with --nnodes > "
        "1; default: a free port on 127.0.0.1).",
    )
    nnodes: int = option(
        1, "Machines one replica's tensor-parallel ranks span, each running `sluice serve` with "
        "its --node-rank (multi-node is untested).",
    )
    node_rank: int = option(0, "This machine's index among --nnodes (0 serves HTTP).")
    attention_backend: str = option(
        "auto", "Attention implementation (auto: flashinfer on CUDA when installed, else "
        "triton, else torch; torch on the CPU; triton on the CPU needs TRITON_INTERPRET=1).",
        ATTENTION_BACKENDS,
    )
    cuda_graph_max_bs: int = option(
        0, "Largest decode batch run through a captured CUDA graph (buckets 1, 2, 4, 8, "
        "16, 24, ...; GPU, triton and flashinfer backends; 0: auto, by GPU memory as SGLang: "
        "256 on an 80-160 GiB GPU)."
    )
    disable_cuda_graph: bool = option(False, "Run decode eagerly: capture no CUDA graphs.")
    tool_call_parser: str = option(
        "", "How tool calls are read from the output for tool_choice auto "
        "(hermes, qwen25, llama3_json; gpt-oss: Harmony, as --reasoning-parser gpt-oss; "
        "empty: auto tool choice is refused).",
        ("", *TOOL_CALL_PARSERS),
    )
    reasoning_parser: str = option(
        "", "How a reasoning model's thinking is separated from its answer in chat replies "
        "(qwen3, deepseek_r1: <think>...</think> into reasoning_content, also when the chat "
        "template opens the block; gpt-oss: the Harmony format read by openai-harmony, "
        "analysis into reasoning_content and calls to functions.* into tool_calls; empty: "
        "none, all text is content).",
        ("", *REASONING_PARSERS),
    )
    max_top_logprobs: int = option(20, "Largest top_logprobs / logprobs k a request may ask.")
    responses_store_size: int = option(
        1024, "Responses kept for previous_response_id and GET /v1/responses/{id} (store: "
        "true), in this server's memory; the least recently used go first (0: store none)."
    )
    responses_store_ttl: float = option(
        3600.0, "Seconds a stored response is kept after it was last used."
    )
    api_key: str = option("", f"Require this bearer token on the API (also ${ENV_API_KEY}).")
    random_seed: int = option(
        -1, "Seed of the seeds drawn for requests that give none (-1: fresh randomness at each "
        "start, so restarts do not repeat samples)."
    )
    disable_warmup: bool = option(False, "Skip the warm-up generation before /health turns 200.")
    log_level: str = option("info", "Log level.", ("debug", "info", "warning", "error"))
    model_cache_dir: str = option("", "Where converted models are cached (default ~/.cache/sluice).")
    drain_timeout: float = option(30.0, "Seconds SIGTERM waits for running requests to finish.")
    enable_lora: bool = option(
        False, "Serve LoRA adapters (PEFT format) on the base model: the request's `model` "
        "names the adapter; POST /v1/load_lora_adapter and /v1/unload_lora_adapter at run time.",
    )
    lora_modules: tuple[str, ...] = option(
        (), "Adapters loaded at start-up: NAME=PATH, or the JSON form "
        '\'{"name": ..., "path": ..., "base_model_name": ...}\' (repeatable; needs --enable-lora).',
        repeatable=True,
    )
    max_loras: int = option(1, "Most distinct adapters in one batch (device slots).")
    max_lora_rank: int = option(16, "Largest adapter rank accepted.")
    max_cpu_loras: int = option(
        0, "Adapters whose weights stay loaded in host memory, least recently used evicted "
        "(and read again from their folder when needed); 0: --max-loras.",
    )
    metrics_compat: str = option(
        "none", "Also expose the scheduler gauges under another server's metric names "
        "(vllm: what the Gateway API Inference Extension's endpoint picker reads).",
        ("none", "vllm"),
    )
    startup_timeout: float = option(
        1800.0, "Seconds to wait for the scheduler to load the model before giving up (exit 1)."
    )
    scheduler_heartbeat_timeout: float = option(
        120.0, f"{LIVE_PATH} turns 503 when requests are in flight and the scheduler has sent "
        "no stats for this many seconds (a hung scheduler: deadlock, stuck collective).",
    )
    watchdog_timeout: float = option(
        300.0, "Watchdog: when requests are in flight and the scheduler has sent nothing for this "
        "many seconds, answer every client with an error and exit non-zero (0: off). Reads the "
        f"same heartbeat as {LIVE_PATH}, so set it above --scheduler-heartbeat-timeout.",
    )
    max_queued_requests: int = option(
        1024, "Requests that may wait beyond --max-running-requests: past running + queued, a "
        "request is refused at once with 503 and Retry-After (-1: no limit; each choice of "
        "n > 1 counts).",
    )
    request_timeout: float = option(
        0.0, "Seconds from arrival a request may take; past it, it is aborted (its KV pages "
        "freed) and answered with 408 (0: no limit).",
    )
    max_request_body_bytes: int = option(
        32 * 2**20, "Largest request body accepted; a larger one gets 413.",
    )
    torch_threads: int = option(
        0, "torch intra-op threads of the model worker on the CPU (0: torch's default, one per "
        "core, capped by the cgroup CPU quota; the tokenizer and detokenizer keep to one).",
    )

    disaggregation_mode: str = option(
        "null", "Prefill/decode disaggregation: 'prefill' computes prompts and hands their KV "
        "pages to a decode server; 'decode' receives them and generates the rest; 'null' "
        "serves whole requests. A P/D server serves only requests sent by `sluice router "
        "--pd-disaggregation`.", DISAGG_MODES,
    )
    disaggregation_bootstrap_port: int = option(
        DISAGG_DEFAULT_BOOTSTRAP_PORT, "prefill: the TCP port decode servers connect to "
        "(reservations in, KV pages out).",
    )
    disaggregation_transfer_backend: str = option(
        "tcp", "How KV pages travel between the two servers.", DISAGG_TRANSFER_BACKENDS
    )
    disaggregation_transfer_timeout: float = option(
        60.0, "Seconds a prefill server keeps a computed prompt's pages waiting for its decode "
        "server, and a decode server keeps reserved pages waiting for their KV; past it, the "
        "request fails and its pages are freed.",
    )

    def __post_init__(self) -> None:
        """On the CPU the auto (0) sizes are fixed values; on a GPU they wait for its memory
        (`engine.gpu_defaults.resolve_for_model`)."""
        if 0 not in (self.max_running_requests, self.chunked_prefill_size, self.cuda_graph_max_bs):
            return
        if self.resolved_device != "cpu":
            return
        for name, value in CPU_AUTO_SIZES.items():
            if getattr(self, name) == 0:
                object.__setattr__(self, name, value)

    @property
    def resolved_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def overlap_schedule(self) -> bool:
        """Whether the scheduler runs the overlap loop (see `overlap_choice`)."""
        return self.overlap_choice[0]

    @property
    def overlap_choice(self) -> tuple[bool, str]:
        """(overlap loop or not, why): off when disabled, on when enabled, else by device."""
        if self.disable_overlap_schedule:
            return False, "--disable-overlap-schedule"
        if self.enable_overlap_schedule:
            return True, "--enable-overlap-schedule"
        if self.resolved_device == "cpu":
            return False, (
                "the CPU default: the scheduler's work and the forward share the cores, so "
                "overlapping them is slower (--enable-overlap-schedule to override)"
            )
        return True, f"the default on {self.resolved_device}"

    @property
    def chunk_size(self) -> int:
        """Largest prompt piece per tick; `max_prefill_tokens` bounds it too."""
        if self.chunked_prefill_size <= 0:
            return self.max_prefill_tokens
        return min(self.chunked_prefill_size, self.max_prefill_tokens)

    def validate(self) -> None:
        problems = []
        if self.page_size < 1:
            problems.append("--page-size must be >= 1")
        if self.max_running_requests < 0:
            problems.append("--max-running-requests must be >= 1 (0: auto)")
        if not 0.0 <= self.swa_full_tokens_ratio <= 1.0:
            problems.append("--swa-full-tokens-ratio must be within [0, 1]")
        parsers = {self.reasoning_parser, self.tool_call_parser}
        if HARMONY_PARSER in parsers and parsers - {HARMONY_PARSER, ""}:
            problems.append("--reasoning-parser gpt-oss and --tool-call-parser gpt-oss (Harmony) "
                            "cannot be combined with another parser")
        if self.max_prefill_tokens < 1:
            problems.append("--max-prefill-tokens must be >= 1")
        if self.max_prefill_streak < 0:
            problems.append("--max-prefill-streak must be >= 0")
        if self.max_total_tokens < 0:
            problems.append("--max-total-tokens must be >= 0")
        if not 0.0 < self.mem_fraction_static < 1.0:
            problems.append("--mem-fraction-static must be in (0, 1)")
        if self.cuda_graph_max_bs < 0:
            problems.append("--cuda-graph-max-bs must be >= 1 (0: auto)")
        if self.attention_backend != "auto":
            from sluice.runtime.attention.availability import backend_problem

            problem = backend_problem(self.attention_backend, self.resolved_device)
            if problem is not None:
                problems.append(problem)
        if self.drain_timeout < 0:
            problems.append(f"{FLAG_DRAIN_TIMEOUT} must be >= 0")
        for flag, value in (
            (FLAG_STARTUP_TIMEOUT, self.startup_timeout),
            (FLAG_SCHEDULER_HEARTBEAT_TIMEOUT, self.scheduler_heartbeat_timeout),
        ):
            if not value > 0:
                problems.append(f"{flag} must be > 0")
        if self.watchdog_timeout < 0:
            problems.append(f"{FLAG_WATCHDOG_TIMEOUT} must be >= 0 (0: off)")
        if self.max_queued_requests < -1:
            problems.append(f"{FLAG_MAX_QUEUED_REQUESTS} must be >= -1 (-1: no limit)")
        if self.request_timeout < 0:
            problems.append(f"{FLAG_REQUEST_TIMEOUT} must be >= 0 (0: no limit)")
        if self.max_request_body_bytes < 1:
            problems.append("--max-request-body-bytes must be >= 1")
        if not 0 <= self.max_top_logprobs <= 100:
            problems.append("--max-top-logprobs must be in [0, 100]")
        if self.responses_store_size < 0:
            problems.append("--responses-store-size must be >= 0 (0: store none)")
        if self.responses_store_ttl <= 0:
            problems.append("--responses-store-ttl must be > 0")
        if self.quantization != "none" and self.device == "cuda":
            problems.append(f"--quantization {self.quantization} is implemented for the CPU only")
        if self.quantization != "none" and self.enable_deterministic_inference:
            problems.append("--quantization cannot be combined with --enable-deterministic-inference")
        problems += self._lora_problems()
        problems += self._tensor_parallel_problems()
        problems += self._disaggregation_problems()
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def disaggregated(self) -> bool:
        return self.disaggregation_mode != "null"

    def _disaggregation_problems(self) -> list[str]:
        if not self.disaggregated:
            return []
        mode = f"--disaggregation-mode {self.disaggregation_mode}"
        problems = []
        if not 0 < self.disaggregation_bootstrap_port < 65536:
            problems.append("--disaggregation-bootstrap-port must be in [1, 65535]")
        if self.disaggregation_transfer_timeout <= 0:
            problems.append("--disaggregation-transfer-timeout must be > 0")
        if self.tensor_parallel_size > 1:
            problems.append(f"{mode} with {FLAG_TENSOR_PARALLEL_SIZE} > 1 is not built yet")
        return problems

    def _lora_problems(self) -> list[str]:
        from sluice.runtime.lora.spec import parse_lora_modules

        if not self.enable_lora:
            return ["--lora-modules needs --enable-lora"] if self.lora_modules else []
        problems = []
        if self.max_loras < 1:
            problems.append("--max-loras must be >= 1")
        if not 1 <= self.max_lora_rank <= 512:
            problems.append("--max-lora-rank must be in [1, 512]")
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            problems.append("--max-cpu-loras must be >= --max-loras (or 0)")
        if self.enable_deterministic_inference:
            problems.append("--enable-lora cannot be combined with --enable-deterministic-inference")
        try:
            parse_lora_modules(self.lora_modules)
        except ValueError as exc:
            problems.append(str(exc))
        return problems

    @property
    def cpu_loras(self) -> int:
        return self.max_cpu_loras or self.max_loras

    def _tensor_parallel_problems(self) -> list[str]:
        """What is wrong with the tensor-parallel flags on their own (what depends on the
        model or the machine is checked at start-up: `launch.startup_problem`)."""
        tp, nnodes = self.tensor_parallel_size, self.nnodes
        if tp < 1:
            return [f"{FLAG_TENSOR_PARALLEL_SIZE} must be >= 1"]
        problems = []
        if nnodes < 1:
            problems.append("--nnodes must be >= 1")
        elif tp % nnodes:
            problems.append(f"{FLAG_TENSOR_PARALLEL_SIZE} {tp} is not a multiple of --nnodes {nnodes}")
        elif not 0 <= self.node_rank < nnodes:
            problems.append(f"--node-rank must be in [0, {nnodes - 1}]")
        if nnodes > 1 and not self.dist_init_addr:
            problems.append("--nnodes > 1 needs --dist-init-addr (host:port on node 0)")
        if self.dist_init_addr:
            from sluice.runtime.distributed.topology import parse_host_port

            if parse_host_port(self.dist_init_addr) is None:
                problems.append(f"--dist-init-addr {self.dist_init_addr!r} is not host:port")
        return problems

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> None:
        add_flags(parser, ServerArgs)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> ServerArgs:
        values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(cls)}
        values["lora_modules"] = tuple(values["lora_modules"] or ())
        if not values["api_key"]:
            values["api_key"] = os.environ.get(ENV_API_KEY, "")
        args = cls(**values)
        args.validate()
        return args
