"""Same question, same answer, bit for bit: in the default CPU path (bf16, the `cpu` attention
backend, the compiled ops; forced here, not left to `--dtype auto`), a token's logits do not
depend on how its forward was cut or what shared it:

- the last tokens computed after a cached prefix equal the whole prompt computed at once
  (1, 2, 5 and 40 new tokens; prompts longer than one split-KV chunk of 256 keys);
- a prompt prefilled in chunks equals it prefilled at once;
- a request inside a batch equals it alone (vLLM's batch 1 vs batch N), prefill and decode.

Families: the Llama shape of SmolLM2 (GQA group of 3), Qwen3-MoE (experts), Gemma 3 (sliding
windows) and Gemma 2 (windows, soft-caps). gpt-oss is not among them: its experts still run
torch's GEMM on a transposed layout (the attention kernel's sinks are checked on their own in
`tests/attention/test_cpu_attention_invariance.py`). The oracle is the model itself computed the
plainest way (one request, whole prompt); `test_cached_prefix_matrix.py` checks that way
against transformers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from model_harness import INIT_RANGE, PagedRunner, prompt
from tiny_model import make_tiny_llama, make_tiny_qwen3_moe
from tiny_windowed import make_tiny_windowed

from sluice.runtime.attention.cpu_backend import KV_CHUNK, CpuAttentionBackend
from sluice.runtime.kernels import cpu_extension
from sluice.runtime.model import cpu_fused_ops
from sluice.runtime.model.causal_lm import CausalLM
from sluice.runtime.model.loader import load_model

pytestmark = pytest.mark.skipif(not cpu_extension.available(), reason="CPU kernels not built")

LLAMA = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
             num_key_value_heads=3, initializer_range=INIT_RANGE, max_position_embeddings=1024)  # fmt: skip
FAMILIES: dict[str, Callable[[Path], Path]] = {
    "llama": lambda p: make_tiny_llama(p, **LLAMA),
    "qwen3_moe": lambda p: make_tiny_qwen3_moe(p, max_position_embeddings=1024),
    "gemma3": lambda p: make_tiny_windowed(p, "gemma3", max_position_embeddings=1024),
    "gemma2": lambda p: make_tiny_windowed(p, "gemma2", max_position_embeddings=1024),
}
PROMPT = KV_CHUNK + 44  # crosses a split-KV chunk boundary


@pytest.fixture(scope="module", params=list(FAMILIES))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    folder = FAMILIES[request.param](tmp_path_factory.mktemp(request.param))
    loaded, _ = load_model(folder, "cpu", torch.bfloat16, CpuAttentionBackend(use_kernels=True))
    assert cpu_fused_ops.enable(loaded) is None
    return loaded


def _runner(model: CausalLM) -> PagedRunner:
    return PagedRunner(model, page_size=1, num_pages=4096, max_requests=12, max_context=1024,
                       kv_dtype=torch.bfloat16)  # fmt: skip


def _ids(model: CausalLM, length: int, seed: int) -> list[int]:
    return prompt(length, seed, model.config.vocab_size)


def test_logits_are_fp32_sums_not_bf16_values(model: CausalLM) -> None:
    logits = _runner(model).run([(0, _ids(model, 20, 1))])
    assert logits.dtype == torch.float32
    off_grid = logits != logits.bfloat16().float()
    assert off_grid.float().mean() > 0.5, "the LM head's logits were rounded to bf16"


@pytest.mark.parametrize("new_tokens", [1, 2, 5, 40])
def test_a_cached_prefix_gives_the_whole_prompts_bits(model: CausalLM, new_tokens: int) -> None:
    ids = _ids(model, PROMPT, 2)
    runner = _runner(model)
    whole = runner.extend([(0, ids)], return_all_logits=True)
    runner.share_prefix(1, 0, PROMPT - new_tokens)
    if new_tokens == 1:  # one new token: the worker runs it as a decode batch
        cached = runner.run([(1, ids[-1:])])
    else:
        cached = runner.extend([(1, ids[-new_tokens:])], return_all_logits=True)
    assert torch.equal(cached, whole[-new_tokens:])
    # and the next token's decode step reads the KV both computed alike
    token = int(whole[-1].argmax())
    assert torch.equal(runner.decode([(1, token)]), runner.decode([(0, token)]))


def test_a_chunked_prefill_gives_the_whole_prompts_bits(model: CausalLM) -> None:
    ids = _ids(model, PROMPT, 3)
    whole = _runner(model).extend([(0, ids)], return_all_logits=True)
    runner = _runner(model)
    chunks = [runner.extend([(0, ids[start : start + 96])], return_all_logits=True)
              for start in range(0, PROMPT, 96)]  # fmt: skip
    assert torch.equal(torch.cat(chunks), whole)


def test_a_request_in_a_batch_gives_its_bits_alone(model: CausalLM) -> None:
    ids = _ids(model, 90, 4)
    alone_runner = _runner(model)
    alone = alone_runner.extend([(0, ids)], return_all_logits=True)
    busy_runner = _runner(model)
    others = [(row, _ids(model, 30 + 17 * row, 10 + row)) for row in range(1, 8)]
    busy = busy_runner.extend([*others[:3], (0, ids), *others[3:]], return_all_logits=True)
    start = sum(len(tokens) for _, tokens in others[:3])
    assert torch.equal(busy[start : start + len(ids)], alone)
    # decode: alone, then among seven other requests
    token = int(alone[-1].argmax())
    decoded_alone = alone_runner.decode([(0, token)])
    mates = [(row, 5 + row) for row in range(1, 8)]
    decoded_busy = busy_runner.decode([*mates[:5], (0, token), *mates[5:]])
    assert torch.equal(decoded_busy[5:6], decoded_alone)
