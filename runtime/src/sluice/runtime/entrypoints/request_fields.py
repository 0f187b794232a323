"""Which request fields Sluice accepts without effect, and which it refuses.

Every field of OpenAI's chat/completions requests and of vLLM's and SGLang's extra-body
lists is one of: honoured (a declared field of the request model), accepted with no
effect (`NO_EFFECT`: it changes nothing about the output, like `user`), or refused with a
400 naming it (`REFUSED`, unless it is sent with its "off" value, e.g. `use_beam_search:
false`). A field in none of these is refused as OpenAI does: "Unrecognized request
argument supplied". The README's field table is this module plus the request models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Refused:
    reason: str
    off: tuple[Any, ...] = (None, False, 0, "", (), [], {})  # values that ask for nothing


def _r(reason: str, *off: Any) -> Refused:
    return Refused(reason, off) if off else Refused(reason)


_MULTIMODAL = "multimodal input is not supported (text-only models)"
_DISAGG = "data-parallel serving is not supported"
_PD = ("Sluice's prefill/decode pairs take their transfer from the headers `sluice router "
       "--pd-disaggregation` adds, not from the body")
_SAMPLER = "is not supported by the sampler"

NO_EFFECT: dict[str, str] = {
    "user": "an end-user id for the caller's own records",
    "metadata": "stored-completion metadata; nothing is stored",
    "store": "nothing is stored",
    "safety_identifier": "an end-user id for the caller's own records",
    "prompt_cache_key": "prefix caching is automatic (radix cache)",
    "prompt_cache_retention": "prefix caching is automatic (radix cache)",
    "session_id": "a caller-side session label",
    "log_metrics": "metrics are always recorded",
    "no_logs": "request contents are never logged",
}

COMMON_REFUSED: dict[str, Refused] = {
    # OpenAI
    "audio": _r("audio output is not supported"),
    "function_call": _r("deprecated: use tools and tool_choice"),
    "functions": _r("deprecated: use tools and tool_choice"),
    "prediction": _r("predicted outputs are not supported"),
    "reasoning_effort": _r("no served chat template takes a reasoning effort (gpt-oss's Harmony format is not built)"),
    "reasoning": _r("reasoning options are not built; a reasoning parser (--reasoning-parser) separates the thinking"),
    "verbosity": _r("verbosity is not supported"),
    "web_search_options": _r("web search is not supported"),
    # vLLM
    "use_beam_search": _r("beam search is not supported"),
    "length_penalty": _r("length_penalty applies to beam search, which is not supported", 1, 1.0),
    "allowed_token_ids": _r(f"allowed_token_ids {_SAMPLER}"),
    "bad_words": _r(f"bad_words {_SAMPLER}"),
    "logprob_token_ids": _r("logprobs of chosen token ids are not supported"),
    "logits_processors": _r("custom logits processors are not supported"),
    "cache_salt": _r("prefix-cache salting is not supported"),
    "kv_transfer_params": _r(_PD),
    "ec_transfer_params": _r("encoder-cache transfer (multimodal) is not supported"),
    "vllm_xargs": _r("vLLM extension arguments are not supported"),
    "mm_processor_kwargs": _r(_MULTIMODAL),
    "media_io_kwargs": _r(_MULTIMODAL),
    "repetition_detection": _r("repetition detection is not supported"),
    "stream_interval": _r("every token is streamed as it is generated", 1),
    "watermarking": _r("watermarking is not supported"),
    "thinking_token_budget": _r("a thinking budget is not built"),
    "include_reasoning": _r("reasoning is included (--reasoning-parser separates it)", True),
    "stream_reasoning": _r("reasoning is streamed as it is generated", True),
    "guided_whitespace_pattern": _r("xgrammar does not support a whitespace pattern"),
    "return_prompt_text": _r("return_prompt_text is not supported"),
    "return_token_offsets": _r("return_token_offsets is not supported"),
    "return_mm_kwargs": _r(_MULTIMODAL, True),
    "routed_experts_prompt_start": _r("expert routing data is not available"),
    "structural_tag": _r("structural tags are not supported"),
    "prompt_embeds": _r("prompt embeddings are not supported"),
    # SGLang
    "stop_regex": _r("stop_regex is not supported"),
    "lora_path": _r("select a LoRA adapter with `model` (its name; /generate takes lora_path)"),
    "lora_id": _r("select a LoRA adapter with `model` (its name)"),
    "session_params": _r("SGLang sessions are not supported"),
    "custom_logit_processor": _r("custom logits processors are not supported"),
    "custom_params": _r("custom logits processors are not supported"),
    "max_dynamic_patch": _r(_MULTIMODAL),
    "min_dynamic_patch": _r(_MULTIMODAL),
    "use_audio_in_video": _r(_MULTIMODAL),
    "images_config": _r(_MULTIMODAL),
    "image_data": _r(_MULTIMODAL),
    "video_data": _r(_MULTIMODAL),
    "audio_data": _r(_MULTIMODAL),
    "input_embeds": _r("input embeddings are not supported"),
    "extra_key": _r("prefix-cache keys are not supported"),
    "ngram_corpus_id": _r("n-gram speculative decoding is not supported"),
    "bootstrap_host": _r(_PD),
    "bootstrap_port": _r(_PD),
    "bootstrap_room": _r(_PD),
    "routed_dp_rank": _r(_DISAGG),
    "disagg_prefill_dp_rank": _r(_DISAGG),
    "data_parallel_rank": _r(_DISAGG),
    "return_hidden_states": _r("hidden states are not returned"),
    "return_routed_experts": _r("expert routing data is not available"),
    "routed_experts_start_len": _r("expert routing data is not available"),
    "return_cached_tokens_details": _r("usage.prompt_tokens_details.cached_tokens has the count"),
    "return_meta_info": _r("return_meta_info is not supported"),
    "task": _r("DeepSeek task tokens are not supported"),
    "custom_labels": _r("custom metric labels are not supported"),
    "token_ids_logprob": _r("logprobs of chosen token ids are not supported"),
    "background": _r("background requests are not supported"),
    "conversation_id": _r("conversation state is not kept"),
    "return_entropy": _r("entropy is not returned"),
    "return_bytes": _r("logprobs carry each token's bytes already"),
}

# /generate's sampling_params
SAMPLING_REFUSED: dict[str, Refused] = {
    "stop_regex": COMMON_REFUSED["stop_regex"],
    "structural_tag": COMMON_REFUSED["structural_tag"],
    "custom_params": COMMON_REFUSED["custom_params"],
    "stream_interval": COMMON_REFUSED["stream_interval"],
    "logit_bias": _r(f"logit_bias {_SAMPLER}"),
}


def is_off(value: Any, rule: Refused) -> bool:
    """The value asks for nothing (booleans compare only with booleans: 1 is not True)."""
    for off in rule.off:
        if isinstance(off, bool) or isinstance(value, bool):
            if isinstance(off, bool) and isinstance(value, bool) and off == value:
                return True
        elif value == off:
            return True
    return False


def unsupported_field(
    extra: dict[str, Any], refused: dict[str, Refused], prefix: str = ""
) -> tuple[str, str] | None:
    """The first extra field that is refused (or unknown) as (name, message); None if all
    of them change nothing."""
    for name, value in extra.items():
        if name in NO_EFFECT:
            continue
        rule = refused.get(name)
        if rule is None:
            return prefix + name, f"Unrecognized request argument supplied: {prefix}{name}"
        if not is_off(value, rule):
            return prefix + name, f"{prefix}{name} is not supported: {rule.reason}"
    return None
