"""Tiny random models with a real tokenizer, written to a folder for tests (no internet).

`make_tiny_llama(path)` / `make_tiny_qwen2(path)` write a Hugging Face model folder:
config.json, model.safetensors, generation_config.json and a fast tokenizer
(tokenizer.json + tokenizer_config.json with a ChatML chat template). The tokenizer is a
byte-level BPE trained in a few milliseconds on a small corpus, so it round-trips any text
(every byte has a token) and multi-byte characters can be split across tokens.

Special tokens: `<|endoftext|>` (id 0, also the pad token), `<|im_start|>` (1) and
`<|im_end|>` (2, the EOS token the chat template ends each turn with).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
EOS_TOKEN_ID = 2

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the capital of France? The capital of France is Paris.",
    "Hello, world! How are you today? I am fine, thank you.",
    "A serving runtime schedules requests, batches them and streams tokens back.",
    "Once upon a time there was a small model that answered every question.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 100 1000 3.14159 -42",
    "def main():\n    print('hello')\n    return 0\n",
    "user assistant system: the quick answer is yes, and the long answer is no.",
    "Café, naïve, façade, jalapeño; 日本語のテキスト; emoji 🙂🚀; Ελληνικά; русский.",
]


def make_tokenizer(vocab_size: int = 512) -> Any:
    """A `PreTrainedTokenizerFast`: byte-level BPE with at most `vocab_size` tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        bos_token=None,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=1 << 20,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def _write(path: Path, config: Any, model_cls: Any, tokenizer: Any, seed: int) -> Path:
    import torch
    from transformers import GenerationConfig

    path.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    GenerationConfig(eos_token_id=EOS_TOKEN_ID, pad_token_id=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _common(tokenizer: Any, vocab_size: int | None, overrides: dict[str, Any]) -> dict[str, Any]:
    vocab = vocab_size or len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} < tokenizer size {len(tokenizer)}")
    cfg: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=0,
        torch_dtype="float32",
    )
    cfg.update(overrides)
    return cfg


def make_tiny_llama(
    path: Path, vocab_size: int | None = None, seed: int = 0, **config_overrides: Any
) -> Path:
    """Write a random 2-layer LlamaForCausalLM (hidden 64, 4 heads, 2 KV heads) and the
    tiny tokenizer into `path`; returns `path`. `config_overrides` go into LlamaConfig
    (e.g. `tie_word_embeddings=True`, `rope_scaling={...}`, `max_position_embeddings=...`).
    `vocab_size` defaults to the tokenizer's size and may be larger (padded vocab)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = make_tokenizer()
    config = LlamaConfig(**_common(tokenizer, vocab_size, config_overrides))
    return _write(Path(path), config, LlamaForCausalLM, tokenizer, seed)


def make_tiny_qwen2(
    path: Path, vocab_size: int | None = None, seed: int = 0, **config_overrides: Any
) -> Path:
    """Like `make_tiny_llama`, but a Qwen2ForCausalLM (q/k/v projections with bias)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = make_tokenizer()
    config = Qwen2Config(**_common(tokenizer, vocab_size, config_overrides))
    return _write(Path(path), config, Qwen2ForCausalLM, tokenizer, seed)


def make_tiny_qwen3(
    path: Path, vocab_size: int | None = None, seed: int = 0, **config_overrides: Any
) -> Path:
    """A Qwen3ForCausalLM: per-head q/k norms, an explicit head_dim (32, not 64 / 4)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = make_tokenizer()
    cfg = {"head_dim": 32, **config_overrides}
    config = Qwen3Config(**_common(tokenizer, vocab_size, cfg))
    return _write(Path(path), config, Qwen3ForCausalLM, tokenizer, seed)


def make_tiny_qwen3_moe(
    path: Path, vocab_size: int | None = None, seed: int = 0, **config_overrides: Any
) -> Path:
    """A Qwen3MoeForCausalLM: 3 layers, the middle one dense (`mlp_only_layers`), the others
    8 experts of width 32, top-2 routing without renormalisation (`norm_topk_prob=False`)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = make_tokenizer()
    cfg = dict(
        num_hidden_layers=3, head_dim=16, num_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=32, mlp_only_layers=[1], decoder_sparse_step=1,
        norm_topk_prob=False,
    )  # fmt: skip
    cfg.update(config_overrides)
    config = Qwen3MoeConfig(**_common(tokenizer, vocab_size, cfg))
    return _write(Path(path), config, Qwen3MoeForCausalLM, tokenizer, seed)


def make_tiny_mixtral(
    path: Path, vocab_size: int | None = None, seed: int = 0, **config_overrides: Any
) -> Path:
    """A MixtralForCausalLM: 4 experts of width 64 in every layer, top-2 routing."""
    from transformers import MixtralConfig, MixtralForCausalLM

    tokenizer = make_tokenizer()
    cfg = dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=64, sliding_window=None)
    cfg.update(config_overrides)
    config = MixtralConfig(**_common(tokenizer, vocab_size, cfg))
    return _write(Path(path), config, MixtralForCausalLM, tokenizer, seed)
