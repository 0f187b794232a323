"""What the model worker reads of the server's flags, as one frozen record.

The engine sits below the server's flags (`server_args`, floor 7): the composition root
hands the worker its flags and the worker keeps only these fields (`EngineConfig.of`, read by
name, so the engine imports no flag type). GPU auto sizes are resolved before
(`gpu_defaults.resolve_for_model`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EngineConfig:
    model: str = ""
    served_model_name: str = ""
    resolved_device: str = "cpu"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    quantization: str = "none"
    attention_backend: str = "auto"
    page_size: int = 1
    max_total_tokens: int = 0
    cpu_kv_cache_gib: float = 1.0
    mem_fraction_static: float = 0.85
    max_running_requests: int = 64
    chunked_prefill_size: int = 2048
    max_context_len: int = 0
    torch_threads: int = 0
    random_seed: int = -1
    enable_deterministic_inference: bool = False
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int = 160
    enable_lora: bool = False
    lora_modules: tuple[str, ...] = ()
    max_loras: int = 1
    max_lora_rank: int = 16
    cpu_loras: int = 8

    @classmethod
    def of(cls, flags: Any) -> EngineConfig:
        """The fields of `flags` (the server's parsed flags, or an EngineConfig) by name."""
        if isinstance(flags, EngineConfig):
            return flags
        return cls(**{f.name: getattr(flags, f.name) for f in fields(cls)})
