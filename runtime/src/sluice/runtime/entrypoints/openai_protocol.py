"""OpenAI-compatible request/response models and the pure rules that validate them.

Requests: `CompletionRequest` (/v1/completions), `ChatCompletionRequest`
(/v1/chat/completions) and `GenerateRequest` (native /generate, SGLang's shape). Unknown
fields are accepted and ignored, like vLLM; declared fields are type-checked strictly (a
string where a number belongs is a 400, not coerced).

Choices made where OpenAI, vLLM and SGLang differ:
- `temperature` >= 0 with no upper bound (vLLM's rule; OpenAI caps at 2); values below
  1e-5 mean greedy. `top_p` in (0, 1]; `top_k` -1 or 0 disables, else >= 1; `min_p` in
  [0, 1]; `repetition_penalty` > 0; `frequency_penalty`/`presence_penalty` in [-2, 2].
- `stop`: a string or a list of any length (vLLM; OpenAI allows 4); empty strings dropped.
- `max_tokens` omitted: 16 for /v1/completions (OpenAI, vLLM and SGLang all default to 16
  there), the rest of the context (`context_len - prompt_len`) for chat, and 128 capped to
  the context for /generate. Chat's `max_completion_tokens` wins over `max_tokens`.
- `n` in [1, 128]: served as n requests whose seeds are `seed + i` (a random base when no
  seed is given, so the samples differ).
- `logprobs`: only the chosen token's logprob. `top_logprobs` (chat) and `logprobs: k`
  (completions) are accepted, but each position's top list holds just the chosen token.
- A field sent as null counts as not sent (its default applies).
- One prompt per request: a string, a list of token ids, or a list holding one of those.
- Not supported (400): non-empty `logit_bias`, `suffix`, `best_of` != n, `echo` with
  `logprobs`, `response_format` other than text, non-text chat content parts.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sluice.runtime.ipc.messages import FinishReason, SamplingParams

MAX_N = 128
COMPLETION_DEFAULT_MAX_TOKENS = 16
GENERATE_DEFAULT_MAX_NEW_TOKENS = 128
GREEDY_BELOW_TEMPERATURE = 1e-5
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


# --- errors ---------------------------------------------------------------------------------
class ProtocolError(Exception):
    """A request the API refuses; rendered as OpenAI's error JSON with `status`."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def from_validation_error(exc: ValidationError) -> ProtocolError:
    """The first problem pydantic found, as a 400 naming the offending field."""
    err = exc.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in err["loc"])
    param = str(err["loc"][0]) if err["loc"] else None
    code = "missing_required_parameter" if err["type"] == "missing" else "invalid_value"
    message = f"{loc}: {err['msg']}" if loc else err["msg"]
    return ProtocolError(message, param=param, code=code)


def model_not_found(model: str) -> ProtocolError:
    return ProtocolError(
        f"The model `{model}` does not exist.", status=404, param="model", code="model_not_found"
    )


# --- strict JSON scalar types ---------------------------------------------------------------
def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("number_type", "Input should be a number")
    return value


Int = Annotated[int, BeforeValidator(_number)]
Float = Annotated[float, BeforeValidator(_number)]
Bool = StrictBool


def _stop_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise PydanticCustomError("stop_type", "Input should be a string or a list of strings")
    return [s for s in dict.fromkeys(value) if s]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _single_prompt(value: Any) -> str | list[int]:
    if isinstance(value, str):
        return value
    if _is_token_ids(value) and value:
        return list(value)
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, str) or _is_token_ids(p) for p in value)
    ):
        if len(value) > 1:
            raise PydanticCustomError(
                "batched_prompt",
                "a list of {count} prompts is not supported; send one prompt per request",
                {"count": len(value)},
            )
        return _single_prompt(value[0])
    raise PydanticCustomError(
        "prompt_type", "Input should be a string or a non-empty list of token ids"
    )


StopList = Annotated[list[str], BeforeValidator(_stop_list)]
Prompt = Annotated[str | list[int], BeforeValidator(_single_prompt)]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, like vLLM

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """A field sent as null is treated as not sent (many clients send nulls)."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class StreamOptions(_Request):
    include_usage: Bool = False


class _SamplingRequest(_Request):
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
    user: str | None = None
    # the extra sampling fields vLLM and SGLang accept
    top_k: Int | None = Field(None, ge=-1)
    min_p: Float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Float | None = Field(None, gt=0.0)
    ignore_eos: Bool = False
    min_tokens: Int = Field(0, ge=0)
    stop_token_ids: list[Annotated[Int, Field(ge=0)]] | None = None
    skip_special_tokens: Bool = True

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise PydanticCustomError("unsupported", "logit_bias is not supported")
        return value

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def wants_logprobs(self) -> bool:
        return False

    def check(self) -> None:
        """Cross-field rules pydantic's per-field checks cannot express."""
        if self.stream_options is not None and not self.stream:
            raise ProtocolError(
                "stream_options can only be set when stream is true", param="stream_options"
            )


class CompletionRequest(_SamplingRequest):
    prompt: Prompt
    max_tokens: Int | None = Field(COMPLETION_DEFAULT_MAX_TOKENS, ge=1)
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: Bool = False
    suffix: str | None = None
    best_of: Int | None = None

    def wants_logprobs(self) -> bool:
        return self.logprobs is not None

    def check(self) -> None:
        super().check()
        if self.suffix:
            raise ProtocolError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of != self.n:
            raise ProtocolError("best_of is not supported (it must equal n)", param="best_of")
        if self.echo and self.logprobs is not None:
            raise ProtocolError("echo with logprobs is not supported", param="echo")


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessage(_Request):
    role: str = Field(min_length=1)  # any role the chat template knows, like vLLM
    content: str | list[ContentPart] | None = None
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        if isinstance(value, list) and any(p.type != "text" for p in value):
            raise PydanticCustomError("content_type", "only text content parts are supported")
        return value

    def for_template(self) -> dict[str, Any]:
        """The message as the chat template expects it: role and a plain-text content."""
        content = self.content
        if isinstance(content, list):
            content = "".join(p.text or "" for p in content)
        out = dict(self.model_extra or {})
        out.update(role=self.role, content=content or "")
        if self.name is not None:
            out["name"] = self.name
        return out


class ResponseFormat(_Request):
    type: str = "text"


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: Bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    add_generation_prompt: Bool = True
    chat_template_kwargs: dict[str, Any] | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def wants_logprobs(self) -> bool:
        return self.logprobs

    def check(self) -> None:
        super().check()
        if self.top_logprobs and not self.logprobs:
            raise ProtocolError("top_logprobs requires logprobs to be true", param="top_logprobs")
        if self.response_format is not None and self.response_format.type != "text":
            raise ProtocolError(
                f"response_format {self.response_format.type!r} is not supported",
                param="response_format",
            )

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]


class NativeSamplingParams(_Request):
    """`sampling_params` of /generate, named as in SGLang."""

    max_new_tokens: Int | None = Field(None, ge=1)
    min_new_tokens: Int = Field(0, ge=0)
    temperature: Float = Field(1.0, ge=0.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(-1, ge=-1)
    min_p: Float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: Float = Field(1.0, gt=0.0)
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    stop: StopList = Field(default_factory=list)
    stop_token_ids: list[Annotated[Int, Field(ge=0)]] | None = None
    ignore_eos: Bool = False
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    skip_special_tokens: Bool = True


class GenerateRequest(_Request):
    text: str | None = None
    input_ids: list[Annotated[Int, Field(ge=0)]] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: Bool = False
    return_logprob: Bool = False
    rid: str | None = None

    def check(self) -> None:
        if (self.text is None) == (self.input_ids is None):
            raise ProtocolError("give exactly one of text and input_ids", param="text")


# --- pure builders --------------------------------------------------------------------------
def check_prompt(prompt_len: int, context_len: int, max_tokens: int | None) -> int:
    """Validate the lengths and return max_new_tokens (the context's rest when None)."""
    if prompt_len == 0:
        raise ProtocolError("The prompt is empty.", param="prompt", code="invalid_value")
    if max_tokens is None:
        if prompt_len >= context_len:
            raise ProtocolError(
                f"This model's maximum context length is {context_len} tokens. However, your "
                f"prompt has {prompt_len} tokens, which leaves no room for the completion. "
                "Please reduce the length of the prompt.",
                param="messages",
                code="context_length_exceeded",
            )
        return context_len - prompt_len
    if prompt_len + max_tokens > context_len:
        raise ProtocolError(
            f"This model's maximum context length is {context_len} tokens. However, you "
            f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return max_tokens


def check_token_ids(ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    for t in ids:
        if not 0 <= t < vocab_size:
            raise ProtocolError(
                f"token id {t} is outside the vocabulary [0, {vocab_size})", param=param
            )


def _temperature(value: float) -> float:
    return 0.0 if value < GREEDY_BELOW_TEMPERATURE else value


def to_sampling_params(
    req: CompletionRequest | ChatCompletionRequest, prompt_len: int, context_len: int
) -> SamplingParams:
    """The scheduler's `SamplingParams` for a validated OpenAI request (one choice)."""
    max_new = check_prompt(prompt_len, context_len, req.requested_max_tokens())
    if req.min_tokens > max_new:
        raise ProtocolError(
            f"min_tokens ({req.min_tokens}) must not exceed max_tokens ({max_new})",
            param="min_tokens",
        )
    return SamplingParams(
        max_new_tokens=max_new,
        min_new_tokens=req.min_tokens,
        temperature=_temperature(1.0 if req.temperature is None else req.temperature),
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=-1 if req.top_k in (None, 0) else req.top_k,
        min_p=req.min_p or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        frequency_penalty=req.frequency_penalty,
        presence_penalty=req.presence_penalty,
        stop=list(req.stop),
        stop_token_ids=list(req.stop_token_ids or []),
        ignore_eos=req.ignore_eos,
        seed=req.seed,
        skip_special_tokens=req.skip_special_tokens,
        logprobs=req.wants_logprobs(),
    )


def native_sampling_params(
    req: GenerateRequest, prompt_len: int, context_len: int
) -> SamplingParams:
    """The scheduler's `SamplingParams` for a validated /generate request."""
    sp = req.sampling_params
    if sp.max_new_tokens is None:
        max_new = min(GENERATE_DEFAULT_MAX_NEW_TOKENS, check_prompt(prompt_len, context_len, None))
    else:
        max_new = check_prompt(prompt_len, context_len, sp.max_new_tokens)
    if sp.min_new_tokens > max_new:
        raise ProtocolError(
            f"min_new_tokens ({sp.min_new_tokens}) must not exceed max_new_tokens ({max_new})",
            param="sampling_params.min_new_tokens",
        )
    return SamplingParams(
        max_new_tokens=max_new,
        min_new_tokens=sp.min_new_tokens,
        temperature=_temperature(sp.temperature),
        top_p=sp.top_p,
        top_k=-1 if sp.top_k == 0 else sp.top_k,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty,
        frequency_penalty=sp.frequency_penalty,
        presence_penalty=sp.presence_penalty,
        stop=list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids or []),
        ignore_eos=sp.ignore_eos,
        seed=sp.seed,
        skip_special_tokens=sp.skip_special_tokens,
        logprobs=req.return_logprob,
    )


def per_choice_params(params: SamplingParams, n: int, base_seed: int) -> list[SamplingParams]:
    """n copies for n choices; choice i gets seed `base + i` (wrapped into int64)."""
    if n == 1:
        return [params]
    base = params.seed if params.seed is not None else base_seed
    return [
        dataclasses.replace(params, seed=((base + i - SEED_MIN) % 2**64) + SEED_MIN)
        for i in range(n)
    ]


def finish_reason(reason: FinishReason | None) -> str | None:
    """OpenAI's finish_reason: 'stop' | 'length' | 'abort' (None while running)."""
    if reason is None:
        return None
    return {"stop": "stop", "length": "length"}.get(reason.kind, "abort")


def stop_reason(reason: FinishReason | None) -> int | str | None:
    """vLLM's `stop_reason`: the stop string or stop token that ended the text, if any."""
    if reason is None or reason.kind != "stop":
        return None
    return reason.matched_str if reason.matched_str is not None else reason.matched_token
