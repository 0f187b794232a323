"""The typed messages the runtime's processes exchange.

Every message is a dataclass registered with the codec; nested dataclasses are allowed.
Flow: TokenizerManager -> Scheduler (TokenizedGenerateReq, AbortReq),
Scheduler -> Detokenizer (BatchTokenIDOut of TokenUpdate records, SchedulerStats passed
through), Detokenizer -> TokenizerManager (BatchStrOut of TextUpdate records,
SchedulerStats), Detokenizer -> Scheduler (StopReq: a stop string matched in the text).
Request ids on these sockets are the TokenizerManager's own, never a client's.
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
      "lark" (spec: a Lark grammar, rule `start`), "any_of" (spec: JSON alternatives of
      literal text and constraints, `constrained.spec.any_of`).
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
    - `spaces_between_special_tokens`: a detokenizer option (sent in `DetokenizeParams`).
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
    # set by the API from the request's `model` (or /generate's lora_path / lora_name): the
    # LoRA adapter's id (`LoadLoraReq.lora_id`); 0 is the base model
    lora_id: int = 0

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


@register
@dataclass(frozen=True)
class DisaggHandoff:
    """Prefill/decode disaggregation: where a request's KV travels. `bootstrap` is the
    prefill server's bootstrap address (host:port) and `room` the id its prefill and decode
    halves share (the router draws it; `constants.DISAGG_ROOM_HEADER`)."""

    bootstrap: str
    room: int


@register
@dataclass
class TokenizedGenerateReq:
    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    arrival_time: float = 0.0
    handoff: DisaggHandoff | None = None  # set on a P/D server only


@register
@dataclass
class FirstToken:
    """What a prefill server computed of a request besides its KV: the first output token,
    with its logprobs and the prompt's (as asked), and the sampler's random state after it
    (so a seeded request samples on as it would on one server)."""

    token: int
    logprob: float | None = None
    top_ids: list[int] | None = None
    top_values: list[float] | None = None
    input_logprobs: list[float] = field(default_factory=list)
    rng_state: bytes = b""
    cached_tokens: int = 0  # prompt tokens the prefill server had in its prefix cache


@register
@dataclass
class KVReceived:
    """Decode side, transfer -> scheduler: room's prompt KV is in its reserved pages."""

    room: int
    tokens: int
    first: FirstToken
    seconds: float  # from the reservation to the last page written


@register
@dataclass
class KVSent:
    """Prefill side, transfer -> scheduler: room's KV has been read out of its pages (they
    may be freed) and is on its way."""

    room: int
    tokens: int


@register
@dataclass
class KVTransferFailed:
    """Transfer -> scheduler: room's transfer will not happen (`message` says why); its
    request ends with an error and its pages are freed."""

    room: int
    message: str


@register
@dataclass
class AbortReq:
    rid: str


@register
@dataclass
class FinishReason:
    """Why a request ended: 'stop' (EOS, stop token or string), 'length', 'abort' (the
    client went away, /abort_request, or the scheduler could not serve it), 'error' (the
    engine failed on the request's batch, or the engine is down: `message` names the cause;
    the API answers 500), or 'timeout' (past `--request-timeout`; the API answers 408)."""

    kind: str
    matched_token: int | None = None
    matched_str: str | None = None
    message: str = ""


@register
@dataclass
class DetokenizeParams:
    """How to turn a request's tokens into text; sent with its first update only."""

    skip_special_tokens: bool = True
    stop: list[str] = field(default_factory=list)
    spaces_between_special_tokens: bool = True
    min_tokens: int = 0  # a stop string counts only if it ends in this token or a later one


@register
@dataclass
class TokenUpdate:
    """One request's new tokens since its last update (and its finish, if it finished)."""

    rid: str
    new_token_ids: list[int]
    logprobs: list[float]  # one per new token when the request asked for logprobs, else empty
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    detokenize: DetokenizeParams | None = None
    # top-k alternatives per new token, best first (empty unless asked): ids and logprobs
    top_logprob_ids: list[list[int]] = field(default_factory=list)
    top_logprob_values: list[list[float]] = field(default_factory=list)
    # prompt logprobs from logprob_start_len on, in a request's first update only
    input_token_logprobs: list[float] = field(default_factory=list)


@register
@dataclass
class BatchTokenIDOut:
    updates: list[TokenUpdate]


@register
@dataclass
class TextUpdate:
    """One request's text delta, with the stop string (if any) already cut off."""

    rid: str
    text: str
    new_token_ids: list[int]
    logprobs: list[float]
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    top_logprob_ids: list[list[int]] = field(default_factory=list)
    top_logprob_values: list[list[float]] = field(default_factory=list)
    input_token_logprobs: list[float] = field(default_factory=list)


@register
@dataclass
class BatchStrOut:
    updates: list[TextUpdate]


@register
@dataclass
class StopReq:
    """The detokenizer found a stop string in a request's text before the scheduler did:
    finish it as stopped (the detokenizer has already told the client)."""

    rid: str
    matched_str: str


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
    # the sliding-window layers' own pool (0 without one): its size, and the share attached
    swa_total_tokens: int = 0
    swa_token_usage: float = 0.0
    prefill_batches_total: int = 0  # ticks that prefilled something
    prefill_rows_total: int = 0  # requests (or chunks) those ticks prefilled
    failed_batches_total: int = 0  # forwards that raised (their requests ended with 'error')
    integrity_checks_total: int = 0  # pool integrity checks passed (each idle, after a fault)
    # seconds from arrival to first admission, one per request admitted since the last message
    queue_times: list[float] = field(default_factory=list)
    # LoRA (--enable-lora): --max-loras, adapters loaded, and per adapter name its requests
    # running and waiting (adapters with none are left out)
    lora_max: int = 0
    lora_loaded: int = 0
    lora_running: dict[str, int] = field(default_factory=dict)
    lora_waiting: dict[str, int] = field(default_factory=dict)
    # prompt tokens this server's forwards computed (cached ones are not), and those still
    # to compute of the waiting requests (what a prefill pool scales on)
    computed_prompt_tokens_total: int = 0
    queue_prompt_tokens: int = 0
    # P/D (--disaggregation-mode): prompt tokens whose KV was sent (prefill) or received
    # (decode), transfers that failed, requests waiting for pages or for their KV (decode),
    # and the seconds of each transfer received since the last message
    disagg_sent_tokens_total: int = 0
    disagg_received_tokens_total: int = 0
    disagg_failed_transfers_total: int = 0
    disagg_waiting_requests: int = 0
    disagg_transfer_seconds: list[float] = field(default_factory=list)


@register
@dataclass
class LoadLoraReq:
    """TokenizerManager -> Scheduler: read and validate an adapter and serve it as
    `lora_id` (a fresh id per load, never reused). Answered by a `LoraOpResult`."""

    op_id: str
    lora_id: int
    name: str
    path: str


@register
@dataclass
class UnloadLoraReq:
    """TokenizerManager -> Scheduler: stop serving `lora_id`; refused (409) while requests
    using it are live. Answered by a `LoraOpResult`."""

    op_id: str
    lora_id: int


@register
@dataclass
class LoraOpResult:
    """Scheduler -> (Detokenizer, passed through) -> TokenizerManager: how a LoRA load or
    unload went; `status` is the HTTP code the API answers with."""

    op_id: str
    ok: bool
    status: int = 200
    message: str = ""
    load_seconds: float = 0.0


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
    model_context_len: int = 0  # the model's own limit, before the KV pool clipped it
    # what the scheduler implements beyond plain sampling; the API refuses a request that
    # needs a feature not listed (names in `sluice.runtime.features`)
    features: list[str] = field(default_factory=list)
    dtype_reason: str = ""
    kv_cache_dtype: str = ""
    quantization: str = "none"
    torch_threads: int = 0
    tensor_parallel_size: int = 1
