"""Pure builders: a validated request -> the scheduler's `SamplingParams`, and the checks
that need the server's capabilities (what the scheduler implements, the flags)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sluice.runtime.entrypoints.errors import ProtocolError, not_supported_yet
from sluice.runtime.entrypoints.json_types import SEED_MIN
from sluice.runtime.entrypoints.openai_protocol import (
    GENERATE_DEFAULT_MAX_NEW_TOKENS,
    GREEDY_BELOW_TEMPERATURE,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    NativeSamplingParams,
)
from sluice.runtime.features import (
    CONSTRAINED,
    PROMPT_LOGPROBS,
    SPACES_BETWEEN_SPECIAL_TOKENS,
    TOP_LOGPROBS,
)
from sluice.runtime.ipc.messages import Constraint, FinishReason, SamplingParams


@dataclass(frozen=True)
class Capabilities:
    """What this server can do, beyond the request models' own rules."""

    features: frozenset[str] = frozenset()  # SchedulerReady.features
    max_top_logprobs: int = 20
    schedule_policy: str = "fcfs"
    tool_call_parser: str = ""


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


def truncate_prompt(ids: list[int], keep: int | None, side: str, context_len: int) -> list[int]:
    """vLLM's `truncate_prompt_tokens`: keep `keep` tokens (-1: the context length), from
    the end (`side` left, the default) or the start (right)."""
    if keep is None:
        return ids
    keep = context_len if keep == -1 else keep
    if keep >= len(ids):
        return ids
    return ids[len(ids) - keep :] if side == "left" else ids[:keep]


def _temperature(value: float) -> float:
    return 0.0 if value < GREEDY_BELOW_TEMPERATURE else value


def check_capabilities(
    caps: Capabilities,
    *,
    constraint: tuple[str, Constraint] | None,
    top_logprobs: int,
    top_param: str,
    priority: int,
    spaces_between_special_tokens: bool,
    prompt_logprobs: str | None = None,
) -> None:
    """Refuse, naming the field, what the scheduler does not implement (yet)."""
    if constraint is not None and CONSTRAINED not in caps.features:
        raise not_supported_yet(constraint[0], "constrained decoding")
    if top_logprobs > caps.max_top_logprobs:
        raise ProtocolError(
            f"{top_param} must be at most {caps.max_top_logprobs} (--max-top-logprobs)",
            param=top_param,
        )
    if top_logprobs > 0 and TOP_LOGPROBS not in caps.features:
        raise not_supported_yet(top_param, "top-k logprobs (only the chosen token's, k = 0)")
    if prompt_logprobs is not None and PROMPT_LOGPROBS not in caps.features:
        raise not_supported_yet(prompt_logprobs, "prompt logprobs")
    if not spaces_between_special_tokens and SPACES_BETWEEN_SPECIAL_TOKENS not in caps.features:
        raise not_supported_yet("spaces_between_special_tokens", "false")
    if priority != 0 and caps.schedule_policy != "priority":
        raise ProtocolError(
            "priority needs the server started with --schedule-policy priority",
            param="priority",
            code="not_supported_yet",
        )


def to_sampling_params(
    req: CompletionRequest | ChatCompletionRequest,
    prompt_len: int,
    context_len: int,
    constraint: Constraint | None = None,
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
        constraint=constraint,
        return_logprob=req.wants_logprobs(),
        top_logprobs_num=req.top_logprobs_num(),
        priority=req.priority,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
    )


def native_sampling_params(
    req: GenerateRequest,
    sp: NativeSamplingParams,
    prompt_len: int,
    context_len: int,
    constraint: Constraint | None = None,
) -> SamplingParams:
    """The scheduler's `SamplingParams` for one prompt of a validated /generate request."""
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
        seed=sp.seed if sp.seed is not None else sp.sampling_seed,
        skip_special_tokens=sp.skip_special_tokens,
        logprobs=req.return_logprob,
        constraint=constraint,
        return_logprob=req.return_logprob,
        top_logprobs_num=req.top_logprobs_num if req.return_logprob else 0,
        logprob_start_len=req.logprob_start_len if req.return_logprob else -1,
        priority=req.priority,
        spaces_between_special_tokens=sp.spaces_between_special_tokens,
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


def finish_reason(reason: FinishReason | None, tool_calls: bool = False) -> str | None:
    """OpenAI's finish_reason: 'stop' | 'length' | 'tool_calls' | 'abort' (None while
    running); 'tool_calls' when the output ended normally with tool calls in it."""
    if reason is None:
        return None
    kind = {"stop": "stop", "length": "length"}.get(reason.kind, "abort")
    return "tool_calls" if tool_calls and kind == "stop" else kind


def stop_reason(reason: FinishReason | None) -> int | str | None:
    """vLLM's `stop_reason`: the stop string or stop token that ended the text, if any."""
    if reason is None or reason.kind != "stop":
        return None
    return reason.matched_str if reason.matched_str is not None else reason.matched_token


def kept_stop_text(reason: FinishReason | None, keep: bool) -> str:
    """`include_stop_str_in_output`: the stop string the detokenizer cut off, to append."""
    if keep and reason is not None and reason.kind == "stop" and reason.matched_str:
        return reason.matched_str
    return ""


def capabilities_of(features: frozenset[str], args: Any) -> Capabilities:
    """`features`: what the scheduler said it implements (SchedulerReady.features)."""
    return Capabilities(
        features=frozenset(features),
        max_top_logprobs=args.max_top_logprobs,
        schedule_policy=args.schedule_policy,
        tool_call_parser=args.tool_call_parser,
    )
