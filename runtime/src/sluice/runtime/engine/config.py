"""What the model worker reads of the server's flags, as one frozen record.

The engine sits below the server's flags (`server_args`, floor 7): the composition root
hands the worker its flags and the worker keeps only these fields (`EngineConfig.of`, read by
name, so the engine imports no flag type). GPU auto sizes are resolved before
(`gpu_defaults.resolve_for_model`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sluice.runtime.dataclass_cli import fields_by_name


@dataclass(frozen=True)
class EngineConfig:
    """No defaults: every field comes from the flags (`of`), whose defaults are the only ones."""

    model: str
    served_model_name: str
    resolved_device: str
    dtype: str
    kv_cache_dtype: str
    quantization: str
    attention_backend: str
    page_size: int
    max_total_tokens: int
    cpu_kv_cache_gib: float
    mem_fraction_static: float
    max_running_requests: int
    max_prefill_tokens: int
    chunked_prefill_size: int
    disable_hybrid_swa_memory: bool
    swa_full_tokens_ratio: float
    max_context_len: int
    torch_threads: int
    random_seed: int
    enable_deterministic_inference: bool
    disable_cuda_graph: bool
    cuda_graph_max_bs: int
    enable_lora: bool
    lora_modules: tuple[str, ...]
    max_loras: int
    max_lora_rank: int
    cpu_loras: int

    @classmethod
    def of(cls, flags: Any) -> EngineConfig:
        """The fields of `flags` (the server's parsed flags, or an EngineConfig) by name."""
        return fields_by_name(cls, flags)
