"""What the API server reads of the server's flags, as one frozen record.

The entrypoints sit above the flags' floor only as users of these fields: the composition
root (`launch.py`) hands `build_app` the parsed flags and the app keeps `ApiConfig.of` them,
read by name, so no route imports the flag type (the engine's `EngineConfig` is the same
rule one floor down).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.runtime.constants import HARMONY_PARSER
from sluice.runtime.dataclass_cli import fields_by_name


@dataclass(frozen=True)
class ApiConfig:
    """No defaults: every field comes from the flags (`of`), whose defaults are the only ones."""

    model: str
    api_key: str
    max_request_body_bytes: int
    disable_radix_cache: bool
    enable_lora: bool
    lora_modules: tuple[str, ...]
    drain_timeout: float
    reasoning_parser: str
    tool_call_parser: str
    max_top_logprobs: int
    responses_store_size: int
    responses_store_ttl: float
    schedule_policy: str
    scheduler_heartbeat_timeout: float
    disaggregation_mode: str

    @property
    def harmony(self) -> bool:
        """gpt-oss's Harmony format: reasoning and tool calls read from the token ids."""
        return HARMONY_PARSER in (self.reasoning_parser, self.tool_call_parser)

    @classmethod
    def of(cls, flags: Any) -> ApiConfig:
        """The fields of `flags` (the server's parsed flags, or an ApiConfig) by name."""
        return fields_by_name(cls, flags)
