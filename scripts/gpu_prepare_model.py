"""Write a SmolLM2-shaped model folder with random weights (for scripts/gpu_check.sh).

The GPU machine has no network and SmolLM2's weights (a 94 MiB GGUF) are more than one
device call may carry, so the check runs SmolLM2's exact architecture and tokenizer
(`.gpu-model/smollm2`, staged by scripts/gpu_stage.sh) with seeded random weights, in
bf16. The init is wider than HF's default (0.02) so that greedy decisions have margins
that bf16 noise rarely reaches; kernels, shapes, batching and throughput are SmolLM2's.

    python3 scripts/gpu_prepare_model.py .gpu-model/smollm2 /tmp/smollm2-random
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

INIT_RANGE = 0.08
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")  # fmt: skip


def main(src: str, dst: str, seed: int = 0) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source, target = Path(src), Path(dst)
    config = AutoConfig.from_pretrained(source)
    config.initializer_range = INIT_RANGE
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(target, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy(source / name, target / name)
    params = sum(p.numel() for p in model.parameters())
    print(f"random {config.architectures} with {params / 1e6:.0f}M parameters in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
