"""The model worker's LoRA manager from the server's flags (`--enable-lora`,
`--lora-modules`, `--max-loras`, ...): the lora package itself knows no flags."""

from __future__ import annotations

import torch
from torch import nn

from sluice.runtime.constants import BUNDLED_MODEL_NAME, BUNDLED_SERVED_NAME
from sluice.runtime.engine.config import EngineConfig
from sluice.runtime.lora.layout import model_lora_layout
from sluice.runtime.lora.manager import LoraConfig, LoraManager, base_model_names
from sluice.runtime.lora.spec import parse_lora_modules


def create_lora_manager(
    args: EngineConfig,
    model: nn.Module,
    device: torch.device | str,
    dtype: torch.dtype,
    model_path: str,
) -> LoraManager | None:
    """The worker's `LoraManager` for `--enable-lora` (None without), with the
    `--lora-modules` adapters registered as ids 1, 2, ... (the API server numbers them the
    same way); a bad one stops the start-up with its reason."""
    if not args.enable_lora:
        return None
    config = LoraConfig(args.max_loras, args.max_lora_rank, args.cpu_loras)
    bundled = (
        (BUNDLED_SERVED_NAME, BUNDLED_MODEL_NAME) if args.model == BUNDLED_MODEL_NAME else ()
    )
    names = base_model_names(args.model, model_path, args.served_model_name, bundled)
    manager = LoraManager(config, model, model_lora_layout(model), device, dtype, names)
    for lora_id, spec in enumerate(parse_lora_modules(args.lora_modules), start=1):
        try:
            manager.register(lora_id, spec.name, spec.path)
        except ValueError as exc:
            raise ValueError(f"--lora-modules {spec.name}={spec.path}: {exc}") from exc
    return manager
