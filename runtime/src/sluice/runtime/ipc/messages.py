"""The typed messages the runtime's processes exchange.

Every message is a dataclass registered with the codec; nested dataclasses are allowed.
Flow: TokenizerManager -> Scheduler (TokenizedGenerateReq, AbortReq, FlushCacheReq),
Scheduler -> Detokenizer (BatchTokenIDOut, SchedulerStats passed through),
Detokenizer -> TokenizerManager (BatchStrOut, SchedulerStats).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.ipc.codec import register


@register
@dataclass
class SamplingParams:
    """Per-request sampling and stopping. Validated by the API layer before it is sent."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    skip_special_tokens: bool = True
    logprobs: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@register
@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = 0.0


@register
@dataclass
class AbortReq:
    rid: str


@register
@dataclass
class FinishReason:
    """Why a request ended: 'stop' (EOS, stop token or string), 'length', or 'abort'."""

    kind: str
    matched_token: int | None = None
    matched_str: str | None = None
    message: str = ""


@register
@dataclass
class BatchTokenIDOut:
    """New token ids since the last message, one entry per request that advanced."""

    rids: list[str]
    new_token_ids: list[list[int]]
    finished: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    logprobs: list[list[float]]
    skip_special_tokens: list[bool]
    stop_strings: list[list[str]]


@register
@dataclass
class BatchStrOut:
    """Text deltas per request, with the stop string (if any) already cut off."""

    rids: list[str]
    text_deltas: list[str]
    new_token_ids: list[list[int]]
    finished: list[FinishReason | None]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    logprobs: list[list[float]]


@register
@dataclass
class SchedulerStats:
    """The scheduler's gauges and counters, published at least once a second and whenever
    the queue, the running set, retractions or KV usage change (`scheduler/process.py`)."""

    queue_requests: int = 0
    running_requests: int = 0
    kv_token_usage: float = 0.0
    new_token_ratio: float = 0.0
    retractions_total: int = 0
    retracted_tokens_total: int = 0
    prefix_cache_hit_ratio: float = 0.0
    generation_throughput: float = 0.0
    max_total_tokens: int = 0
    free_tokens: int = 0
    cached_tokens: int = 0
    # seconds from arrival to first admission, one per request admitted since the last message
    queue_times: list[float] = field(default_factory=list)


@register
@dataclass
class SchedulerReady:
    """Sent once by the scheduler when the model is loaded and the pool is sized."""

    max_total_tokens: int
    max_running_requests: int
    context_len: int
    page_size: int
    vocab_size: int
    eos_token_ids: list[int]
    device: str
    dtype: str
    attention_backend: str
    dtype_reason: str = ""
    kv_cache_dtype: str = ""
    quantization: str = "none"
    torch_threads: int = 0
