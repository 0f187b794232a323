"""Random PEFT LoRA adapters for tests, and PEFT's own greedy output as the oracle.

`make_adapter(base, folder, rank, seed)` writes a PEFT adapter (adapter_config.json +
adapter_model.safetensors) for the model folder `base`, with random non-zero A and B on
q/k/v/o and gate/up/down (PEFT's `init_lora_weights=False`), so the adapter changes the
output. `PeftOracle` runs `PeftModel.generate` greedily in fp32 on the same base weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(
    base: Path,
    folder: Path,
    rank: int = 8,
    seed: int = 1,
    targets: list[str] | None = None,
    alpha: int | None = None,
    use_rslora: bool = False,
    scale_b: float = 1.0,
) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets or ALL_TARGETS,
        lora_dropout=0.0, init_lora_weights=False, use_rslora=use_rslora,
    )  # fmt: skip
    peft_model = get_peft_model(model, config)
    if scale_b != 1.0:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(scale_b)
    peft_model.save_pretrained(folder)
    return Path(folder)


class PeftOracle:
    """Greedy generation by PEFT on the base model, per adapter folder (None: the base)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._models: dict[str | None, Any] = {}

    def model(self, adapter: Path | None) -> Any:
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        key = str(adapter) if adapter else None
        if key not in self._models:
            m = AutoModelForCausalLM.from_pretrained(self.base, torch_dtype=torch.float32)
            if adapter is not None:
                m = PeftModel.from_pretrained(m, adapter)
            self._models[key] = m.eval()
        return self._models[key]

    def generate(self, adapter: Path | None, prompt: list[int], max_new_tokens: int) -> list[int]:
        import torch

        model = self.model(adapter)
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                do_sample=False, eos_token_id=None, pad_token_id=0,
            )  # fmt: skip
        return out[0, len(prompt) :].tolist()
