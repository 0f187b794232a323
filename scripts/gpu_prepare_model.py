"""Write a model folder with random bf16 weights made on the GPU (for scripts/gpu_check.sh).

The GPU machine has no network and no real weights fit one device call, so the check runs
a real architecture and the bundled tokenizer (`.gpu-model/smollm2`, staged by
scripts/gpu_stage.sh) with seeded random weights:

- `smollm2` (default): SmolLM2-135M's own config;
- `llama-3.1-8b`: Llama-3.1-8B's layers, hidden size, heads and MLP (32 x 4096, 32 query /
  8 KV heads of 128, MLP 14336, untied LM head, rope theta 500000), with the bundled
  tokenizer's vocabulary, so speed figures mean what they mean for an 8B model.

The init is wider than HF's default (0.02) so that greedy decisions have margins that bf16
noise rarely reaches.

    python3 scripts/gpu_prepare_model.py .gpu-model/smollm2 /tmp/llama8b --shape llama-3.1-8b
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

INIT_RANGE = 0.08
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json")  # fmt: skip


LLAMA_31_8B = dict(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    num_key_value_heads=8, head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5,
    max_position_embeddings=8192, tie_word_embeddings=False, hidden_act="silu",
)  # fmt: skip
SHAPES = ("smollm2", "llama-3.1-8b")


def model_config(source: Path, shape: str):  # noqa: ANN201
    """The config to build: the source's own, or Llama-3.1-8B's layers on its vocabulary."""
    from transformers import AutoConfig, LlamaConfig

    own = AutoConfig.from_pretrained(source)
    if shape == "smollm2":
        return own
    if shape != "llama-3.1-8b":
        raise SystemExit(f"unknown shape {shape!r}; one of {', '.join(SHAPES)}")
    return LlamaConfig(
        vocab_size=own.vocab_size, bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id,
        architectures=["LlamaForCausalLM"], **LLAMA_31_8B,
    )  # fmt: skip


def main(src: str, dst: str, shape: str = "smollm2", seed: int = 0) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    source, target = Path(src), Path(dst)
    config = model_config(source, shape)
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
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="folder with config.json and the tokenizer")
    parser.add_argument("target", help="folder to write")
    parser.add_argument("--shape", default="smollm2", choices=SHAPES)
    ns = parser.parse_args()
    sys.exit(main(ns.source, ns.target, ns.shape))
