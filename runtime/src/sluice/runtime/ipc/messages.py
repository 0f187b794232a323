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
@dataclass(frozen=True)
class Constraint:
    """What a request's output must match (constrained decoding). Built and validated by the
    API layer (`entrypoints/constraints.py`); compiled in the scheduler process by
    `sluice.runtime.constrained.GrammarCompiler`, which caches per (kind, spec, strict).

    kind: one of `sluice.runtime.constrained.CONSTRAINT_KINDS`:
      "json_schema" (spec: the schema as JSON text), "json_object" (spec: ""; any JSON
      object), "regex" (spec: the pattern), "choice" (spec: a JSON list of strings; the
      output is exactly one of them), "ebnf" (spec: an xgrammar/GBNF grammar, rule `root`),
      "lark" (spec: a Lark grammar, rule `start`).
    strict: json_schema only: True forbids properties and array items the schema does not
      declare (OpenAI's `strict`); False follows JSON Schema literally (unlisted properties
      allowed unless `additionalProperties: false`).
    """

    kind: str
    spec: str
    strict: bool = True


@register
@dataclass
class SamplingParams:
    """Per-request sampling and stopping. Validated by the API layer before it is sent.

    The fields after `logprobs` are set by the API and wired by the scheduler and sampler:
    - `constraint`: constrained decoding (None: unconstrained); see `Constraint`.
    - `return_logprob`: SGLang's name; the API sets `logprobs` and this together.
    - `top_logprobs_num`: top-k alternatives per output position (0: only the chosen
      token's logprob when `logprobs`), k <= `--max-top-logprobs`.
    - `logprob_start_len`: prompt logprobs from this prompt position on (-1: none; SGLang).
    - `priority`: lower is served first under `--schedule-policy priority` (vLLM); 0 default.
    - `spaces_between_special_tokens`: a detokenizer option (passed through
      `BatchTokenIDOut.spaces_between_special_tokens`).
    """

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
    constraint: Constraint | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    logprob_start_len: int = -1
    priority: int = 0
    spaces_between_special_tokens: bool = True

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
    # per request, like skip_special_tokens; empty (not filled by the scheduler yet): all True
    spaces_between_special_tokens: list[bool] = field(default_factory=list)
    # top-k logprobs, per request and new token: the k best ids and their logprobs (best
    # first); empty lists when not asked. Passed through to BatchStrOut unchanged.
    top_logprob_ids: list[list[list[int]]] = field(default_factory=list)
    top_logprob_values: list[list[list[float]]] = field(default_factory=list)
    # prompt logprobs from logprob_start_len on (one per prompt token after the first),
    # sent once, in a request's first update; empty otherwise
    input_token_logprobs: list[list[float]] = field(default_factory=list)


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
    top_logprob_ids: list[list[list[int]]] = field(default_factory=list)
    top_logprob_values: list[list[list[float]]] = field(default_factory=list)
    input_token_logprobs: list[list[float]] = field(default_factory=list)


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
    # what the scheduler implements beyond plain sampling; the API refuses a request that
    # needs a feature not listed (names in `sluice.runtime.entrypoints.features`)
    features: list[str] = field(default_factory=list)
