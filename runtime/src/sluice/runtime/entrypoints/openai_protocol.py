"""OpenAI-compatible request models and the pure rules that validate them.

Requests: `CompletionRequest` (/v1/completions), `ChatCompletionRequest`
(/v1/chat/completions) and `GenerateRequest` (native /generate, SGLang's shape). Declared
fields are honoured and type-checked strictly (a string where a number belongs is a 400,
not coerced). Every other field is accepted only if it changes nothing (`user`,
`metadata`, ...) or is sent with its "off" value, and is otherwise refused with a 400
naming it (`request_fields`). Nested objects (stream_options, tools, ...) refuse unknown
keys outright.

Choices made where OpenAI, vLLM and SGLang differ:
- `temperature` >= 0 with no upper bound (vLLM's rule; OpenAI caps at 2); values below
  1e-5 mean greedy. `top_p` in (0, 1]; `top_k` -1 or 0 disables, else >= 1; `min_p` in
  [0, 1]; `repetition_penalty` > 0; `frequency_penalty`/`presence_penalty` in [-2, 2].
- `stop`: a string or a list of at most `json_types.MAX_STOP_STRINGS` (16; OpenAI allows 4,
  vLLM any number) of at most `MAX_STOP_STRING_CHARS` (256) characters each; empty strings
  dropped. Every string is looked for after every token, so an unbounded list costs every
  request in the batch.
- `max_tokens` omitted: 16 for /v1/completions (OpenAI, vLLM and SGLang all default to 16
  there), the rest of the context (`context_len - prompt_len`) for chat, and 128 capped to
  the context for /generate. Chat's `max_completion_tokens` wins over `max_tokens`.
- `n` in [1, 128]: served as n requests whose seeds are `seed + i` (a random base when no
  seed is given, so the samples differ).
- A field sent as null counts as not sent (its default applies).
- `prompt` (completions) and `text`/`input_ids` (/generate) may be one prompt or a list.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from sluice.runtime.entrypoints.errors import ProtocolError
from sluice.runtime.entrypoints.json_types import (
    SEED_MAX,
    SEED_MIN,
    Bool,
    Float,
    Int,
    Prompts,
    StopList,
    TokenId,
)
from sluice.runtime.entrypoints.message_rules import Role, message_problem
from sluice.runtime.entrypoints.request_fields import (
    COMMON_REFUSED,
    SAMPLING_REFUSED,
    Refused,
    unsupported_field,
)
from sluice.runtime.entrypoints.tools import ToolChoice, ToolDef

MAX_N = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
GREEDY_BELOW_TEMPERATURE = 1e-5


class StrictObject(BaseModel):
    """A nested object: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid")


def _closed(schema: dict[str, Any]) -> None:
    """In the OpenAPI document: a field the model does not declare is refused (only the
    accepted-without-effect ones pass, and they need no documenting)."""
    schema["additionalProperties"] = False


class RequestBody(BaseModel):
    """A request body. Extra fields are kept so that `unsupported()` can name them."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, json_schema_extra=_closed)
    REFUSED: ClassVar[dict[str, Refused]] = COMMON_REFUSED

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """A field sent as null is treated as not sent (many clients send nulls)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def unsupported(self) -> ProtocolError | None:
        found = unsupported_field(self.model_extra or {}, self.REFUSED)
        if found is None:
            return None
        name, message = found
        return ProtocolError(message, param=name, code="unsupported_parameter")


class StreamOptions(StrictObject):
    include_usage: Bool = False
    continuous_usage_stats: Bool = False  # vLLM: usage in every chunk
    include_obfuscation: Bool = False  # no effect: no obfuscation padding is added


class JsonSchemaFormat(StrictObject):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Bool | None = None


class ResponseFormat(StrictObject):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(StrictObject):
    """vLLM's `structured_outputs` (the successor of its guided_* fields)."""

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: Bool | None = None
    disable_any_whitespace: Literal[True] | None = None  # what Sluice does already
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _SamplingRequest(RequestBody):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None  # None: the served model
    max_tokens: Int | None = Field(None, ge=1)
    temperature: Float | None = Field(None, ge=0.0)
    top_p: Float | None = Field(None, gt=0.0, le=1.0)
    n: Int = Field(1, ge=1, le=MAX_N)
    stream: Bool = False
    stream_options: StreamOptions | None = None
    stop: StopList = Field(default_factory=list)
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Float] | None = None
    service_tier: Literal["auto", "default"] | None = None  # no tiers: both mean the same
    # the extra sampling fields vLLM and SGLang accept
    top_k: Int | None = Field(None, ge=-1)
    min_p: Float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Float | None = Field(None, gt=0.0)
    ignore_eos: Bool = False
    min_tokens: Int = Field(0, ge=0)
    stop_token_ids: list[TokenId] | None = None
    skip_special_tokens: Bool = True
    spaces_between_special_tokens: Bool = True
    include_stop_str_in_output: Bool = False
    no_stop_trim: Bool = False  # SGLang's name for include_stop_str_in_output
    truncate_prompt_tokens: Int | None = Field(None, ge=-1)
    truncation_side: Literal["left", "right"] = "left"
    prompt_logprobs: Int | None = Field(None, ge=0)
    return_token_ids: Bool = False
    return_tokens_as_token_ids: Bool = False
    priority: Int = 0
    request_id: str | None = Field(None, min_length=1)
    rid: str | None = Field(None, min_length=1)
    # constrained decoding, any one of (see entrypoints/constraints.py)
    response_format: ResponseFormat | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: Literal["xgrammar", "auto", ""] | None = None
    structured_outputs: StructuredOutputs | None = None
    regex: str | None = None
    ebnf: str | None = None
    json_schema: str | None = None  # SGLang: the schema as a JSON string

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise PydanticCustomError("unsupported", "logit_bias is not supported by the sampler")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.continuous_usage_stats)

    @property
    def keep_stop_string(self) -> bool:
        return self.include_stop_str_in_output or self.no_stop_trim

    @property
    def client_rid(self) -> str | None:
        return self.rid or self.request_id

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def top_logprobs_num(self) -> int:
        return 0

    def wants_logprobs(self) -> bool:
        return False

    def check(self) -> None:
        """Cross-field rules pydantic's per-field checks cannot express."""
        if self.stream_options is not None and not self.stream:
            raise ProtocolError(
                "stream_options can only be set when stream is true", param="stream_options"
            )
        if self.rid and self.request_id and self.rid != self.request_id:
            raise ProtocolError("give one of rid and request_id", param="rid")


class CompletionRequest(_SamplingRequest):
    prompt: Prompts
    max_tokens: Int | None = Field(COMPLETION_DEFAULT_MAX_TOKENS, ge=1)
    logprobs: Int | None = Field(None, ge=0)
    echo: Bool = False
    suffix: str | None = None
    best_of: Int | None = None
    add_special_tokens: Bool = True

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def top_logprobs_num(self) -> int:
        return self.logprobs or 0

    def check(self) -> None:
        super().check()
        if self.suffix:
            raise ProtocolError("suffix is not supported (no fill-in-the-middle)", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ProtocolError("best_of is not supported (it must equal n)", param="best_of")


class ContentPart(StrictObject):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """A message; keys beyond these reach the chat template as they are."""

    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, list) and any(
            not isinstance(p, dict) or p.get("type") != "text" for p in value
        ):
            raise PydanticCustomError("content_type", "only text content parts are supported")
        return value

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content or ""


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: Bool = False
    top_logprobs: Int = Field(0, ge=0)
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: Bool = True
    modalities: list[Literal["text"]] | None = None
    add_generation_prompt: Bool = True
    continue_final_message: Bool = False
    add_special_tokens: Bool = False
    documents: list[dict[str, Any]] | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    echo: Bool = False
    input_ids: list[TokenId] | None = Field(None, min_length=1)  # SGLang: skip the template
    separate_reasoning: Bool = True  # SGLang: with --reasoning-parser, reasoning_content apart

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def top_logprobs_num(self) -> int:
        return self.top_logprobs if self.logprobs else 0

    @property
    def effective_tool_choice(self) -> ToolChoice:
        """OpenAI's default: "auto" when tools are given, else "none"."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise ProtocolError("top_logprobs requires logprobs to be true", param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            if "add_generation_prompt" in self.model_fields_set:
                raise ProtocolError(
                    "continue_final_message and add_generation_prompt cannot both be true",
                    param="continue_final_message",
                )
            self.add_generation_prompt = False
        if self.continue_final_message and self.messages[-1].role != "assistant":
            raise ProtocolError(
                "continue_final_message needs the last message to be the assistant's",
                param="continue_final_message",
            )
        if (problem := message_problem(self.messages)) is not None:
            raise ProtocolError(problem[1], param=problem[0])


class NativeSamplingParams(RequestBody):
    """`sampling_params` of /generate, named as in SGLang."""

    REFUSED: ClassVar[dict[str, Refused]] = SAMPLING_REFUSED
    max_new_tokens: Int | None = Field(None, ge=1)
    min_new_tokens: Int = Field(0, ge=0)
    n: Int = Field(1, ge=1, le=MAX_N)
    temperature: Float = Field(1.0, ge=0.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1)
    min_p: Float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: Float = Field(1.0, gt=0.0)
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    stop: StopList = Field(default_factory=list)
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: Bool = False
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    sampling_seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)  # SGLang's name
    skip_special_tokens: Bool = True
    spaces_between_special_tokens: Bool = True
    no_stop_trim: Bool = False
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None


def _native_params(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


class GenerateRequest(RequestBody):
    text: str | list[str] | None = None
    input_ids: list[TokenId] | list[list[TokenId]] | None = None
    sampling_params: Annotated[
        list[NativeSamplingParams], BeforeValidator(_native_params)
    ] = Field(default_factory=lambda: [NativeSamplingParams()])
    stream: Bool = False
    return_logprob: Bool = False
    logprob_start_len: Int = Field(-1, ge=-1)
    top_logprobs_num: Int = Field(0, ge=0)
    return_text_in_logprobs: Bool = False
    rid: str | list[str] | None = None
    priority: Int = 0
    # SGLang: the LoRA adapter (its name, or the folder it was loaded from), one for all
    # prompts or one per prompt (null: the base model); or vLLM-style by name
    lora_path: str | list[str | None] | None = None
    lora_name: str | None = None

    @property
    def is_batch(self) -> bool:
        return isinstance(self.text, list) or (
            isinstance(self.input_ids, list) and bool(self.input_ids)
            and isinstance(self.input_ids[0], list)
        )

    def prompts(self) -> list[str | list[int]]:
        if self.text is not None:
            return list(self.text) if isinstance(self.text, list) else [self.text]
        ids = self.input_ids or []
        return [list(p) for p in ids] if self.is_batch else [list(ids)]  # type: ignore[arg-type]

    def unsupported(self) -> ProtocolError | None:
        problem = super().unsupported()
        for sp in self.sampling_params:
            found = unsupported_field(sp.model_extra or {}, sp.REFUSED, "sampling_params.")
            if problem is None and found is not None:
                name, message = found
                problem = ProtocolError(message, param=name, code="unsupported_parameter")
        return problem

    def check(self) -> None:
        if (self.text is None) == (self.input_ids is None):
            raise ProtocolError("give exactly one of text and input_ids", param="text")
        prompts = self.prompts()
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ProtocolError("empty prompt", param="text" if self.text is not None else "input_ids")
        if len(self.sampling_params) not in (1, len(prompts)):
            raise ProtocolError(
                f"sampling_params: give one, or one per prompt ({len(prompts)})",
                param="sampling_params",
            )
        if self.rid is not None:
            rids = self.rid if isinstance(self.rid, list) else [self.rid]
            if len(rids) != len(prompts) or len(set(rids)) != len(rids):
                raise ProtocolError("rid: give one distinct id per prompt", param="rid")


class AbortRequest(RequestBody):
    """SGLang's POST /abort_request body."""

    rid: str = ""
    abort_all: Bool = False

    def check(self) -> None:
        if not self.rid and not self.abort_all:
            raise ProtocolError("give rid, or abort_all: true", param="rid")
