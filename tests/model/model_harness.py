"""Tiny random HF models and a hand-driven paged KV cache for the model tests.

`PagedRunner` plays the scheduler's part: it hands out whole KV pages (in a shuffled
order, so a request's pages are not contiguous), fills `req_to_token` rows, and builds the
`ForwardBatch` of an extend or a decode step exactly as the scheduler does.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tiny_model import (  # tests/ is on sys.path (tests/conftest.py)
    make_tiny_llama,
    make_tiny_mixtral,
    make_tiny_qwen2,
    make_tiny_qwen3,
    make_tiny_qwen3_moe,
)

from sluice.runtime.forward import ForwardBatch, ForwardMode
from sluice.runtime.memory.kv_buffers import KVBuffers
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.llama import LlamaForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_CACHE_DIR = REPO_ROOT / ".cache" / "models"
LOGIT_TOLERANCE = 1e-4
INIT_RANGE = 0.08  # wider than HF's 0.02 so greedy tokens have clear margins

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def perturb_and_resave(folder: Path, seed: int) -> None:
    """HF initialises norms to 1 and biases to 0; make them random so loading them matters."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(folder, safe_serialization=True)


def _make_mistral(folder: Path, seed: int) -> Path:
    """A Mistral whose head_dim (32) is not hidden_size / heads (16)."""
    from transformers import MistralConfig, MistralForCausalLM

    # the tokenizer and generation config come from a tiny Llama; the weights are replaced
    make_tiny_llama(folder, seed=seed, initializer_range=INIT_RANGE)
    config = MistralConfig(
        vocab_size=json.loads((folder / "config.json").read_text())["vocab_size"],
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        sliding_window=None,
        initializer_range=INIT_RANGE,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    MistralForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


VARIANTS = {
    "llama": lambda p: make_tiny_llama(p, seed=1, initializer_range=INIT_RANGE),
    "qwen2": lambda p: make_tiny_qwen2(p, seed=2, initializer_range=INIT_RANGE),
    "llama3_rope": lambda p: make_tiny_llama(
        p, seed=3, initializer_range=INIT_RANGE, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0
    ),
    "tied": lambda p: make_tiny_llama(
        p, seed=4, initializer_range=INIT_RANGE, tie_word_embeddings=True
    ),
    "mistral": lambda p: _make_mistral(p, seed=5),
    "llama_biases": lambda p: make_tiny_llama(
        p, seed=6, initializer_range=INIT_RANGE, attention_bias=True, mlp_bias=True
    ),
    "qwen3": lambda p: make_tiny_qwen3(p, seed=7, initializer_range=INIT_RANGE),
}
MOE_VARIANTS = {
    "qwen3_moe": lambda p: make_tiny_qwen3_moe(p, seed=8, initializer_range=INIT_RANGE),
    "mixtral": lambda p: make_tiny_mixtral(p, seed=9, initializer_range=INIT_RANGE),
}


@dataclass
class ModelPair:
    """Our model and transformers' model on the same weights."""

    name: str
    folder: Path
    model: LlamaForCausalLM
    config: ModelConfig
    hf_model: torch.nn.Module

    @torch.inference_mode()
    def hf_logits(self, ids: list[int]) -> torch.Tensor:
        """HF's logits `[len(ids), vocab]` for one whole sequence."""
        return self.hf_model(torch.tensor([ids])).logits[0].float()


@dataclass
class PagedRunner:
    """Owns a KV pool and request rows; runs extend/decode steps through the model."""

    model: LlamaForCausalLM
    page_size: int
    num_pages: int = 64
    max_requests: int = 8
    max_context: int = 256
    seed: int = 0
    kv_dtype: torch.dtype = torch.float32
    kv: KVBuffers = field(init=False)
    req_to_token: torch.Tensor = field(init=False)
    lens: list[int] = field(init=False)
    pages: list[list[int]] = field(init=False)
    free_pages: list[int] = field(init=False)

    def __post_init__(self) -> None:
        c = self.model.config
        self.kv = KVBuffers(
            self.num_pages * self.page_size,
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            self.kv_dtype,
            "cpu",
        )
        self.req_to_token = torch.zeros(self.max_requests, self.max_context, dtype=torch.int32)
        self.lens = [0] * self.max_requests
        self.pages = [[] for _ in range(self.max_requests)]
        self.free_pages = list(range(1, self.num_pages))  # page 0 holds the reserved slot 0
        random.Random(self.seed).shuffle(self.free_pages)

    def _allocate(self, req: int, count: int) -> list[int]:
        slots = []
        for pos in range(self.lens[req], self.lens[req] + count):
            if pos % self.page_size == 0:
                self.pages[req].append(self.free_pages.pop())
            slots.append(
                self.pages[req][pos // self.page_size] * self.page_size + pos % self.page_size
            )
        self.req_to_token[req, self.lens[req] : self.lens[req] + count] = torch.tensor(slots)
        return slots

    def share_prefix(self, dst: int, src: int, length: int) -> None:
        """Point `dst`'s first `length` tokens at `src`'s cached pages (whole pages only)."""
        assert length % self.page_size == 0 and self.lens[dst] == 0
        self.pages[dst] = self.pages[src][: length // self.page_size]
        self.req_to_token[dst, :length] = self.req_to_token[src, :length]
        self.lens[dst] = length

    def extend(
        self, requests: list[tuple[int, list[int]]], return_all_logits: bool = False
    ) -> torch.Tensor:
        """Prefill `(request row, new token ids)` on top of whatever each row has cached."""
        return self._run(ForwardMode.EXTEND, requests, return_all_logits)

    def decode(self, requests: list[tuple[int, int]]) -> torch.Tensor:
        """One decode step: `(request row, its latest token id)`."""
        return self._run(ForwardMode.DECODE, [(r, [t]) for r, t in requests], False)

    @staticmethod
    def mode_for(requests: list[tuple[int, list[int]]]) -> ForwardMode:
        """The mode the model worker gives a batch: decode when every row computes one token."""
        single = all(len(tokens) == 1 for _, tokens in requests)
        return ForwardMode.DECODE if single else ForwardMode.EXTEND

    def run(self, requests: list[tuple[int, list[int]]]) -> torch.Tensor:
        """One forward as the model worker runs it: `(request row, new token ids)` rows on
        top of what each row holds, in the mode the worker would pick."""
        return self._run(self.mode_for(requests), requests, False)

    def _run(
        self, mode: ForwardMode, requests: list[tuple[int, list[int]]], all_logits: bool
    ) -> torch.Tensor:
        ids, positions, locs, prefix_lens, extend_lens = [], [], [], [], []
        for req, tokens in requests:
            prefix_lens.append(self.lens[req])
            extend_lens.append(len(tokens))
            positions += range(self.lens[req], self.lens[req] + len(tokens))
            locs += self._allocate(req, len(tokens))
            ids += tokens
            self.lens[req] += len(tokens)
        seq_lens = [p + e for p, e in zip(prefix_lens, extend_lens, strict=True)]
        batch = ForwardBatch(
            mode=mode,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            out_cache_loc=torch.tensor(locs, dtype=torch.int64),
            req_pool_indices=torch.tensor([r for r, _ in requests], dtype=torch.int64),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
            prefix_lens=torch.tensor(prefix_lens, dtype=torch.int64),
            extend_lens=torch.tensor(extend_lens, dtype=torch.int64),
            seq_lens_cpu=seq_lens,
            prefix_lens_cpu=prefix_lens,
            extend_lens_cpu=extend_lens,
            req_to_token=self.req_to_token,
            kv=self.kv,
            return_all_logits=all_logits,
        )
        return self.model(batch)


def assert_logits_close(ours: torch.Tensor, reference: torch.Tensor) -> None:
    assert ours.shape == reference.shape
    error = (ours - reference).abs().max().item()
    assert error <= LOGIT_TOLERANCE, f"max abs logit error {error:.2e} > {LOGIT_TOLERANCE:.0e}"


def assert_same_greedy_tokens(
    ours: torch.Tensor, reference: torch.Tensor, margin: float = 1e-3
) -> None:
    """Argmax agrees on every row whose reference top-2 gap is wider than `margin`."""
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > margin
    assert clear.any(), "no row has a clear top-1 token; the test model is too flat"
    assert torch.equal(ours.argmax(-1)[clear], reference.argmax(-1)[clear])


def prompt(length: int, seed: int, vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=generator).tolist()
