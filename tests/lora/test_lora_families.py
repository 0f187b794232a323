"""LoRA beyond the Llama family, against PEFT on the same fp32 weights.

Where an adapter may attach comes from each architecture's weight rules (`lora.layout`):
Qwen3-MoE, Mixtral and gpt-oss take adapters on their attention projections, Gemma 2/3 and
Qwen3 on attention and MLP; an adapter on
an expert layer's MLP (PEFT's `target_parameters` on the experts, or an older adapter's
per-expert modules) is refused with a message naming what it targets. A mixed batch (adapter rows next to a base row)
is prefilled and decoded greedily through the model; PEFT's logits and greedy tokens on
each row are the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_adapters import ALL_TARGETS, make_adapter
from paged_model import PagedSession
from tiny_model import make_tiny_mixtral, make_tiny_qwen3, make_tiny_qwen3_moe
from tiny_windowed import make_tiny_gemma3_multimodal, make_tiny_windowed

from sluice.runtime.forward import ForwardMode
from sluice.runtime.lora.adapter import LoraAdapterError
from sluice.runtime.lora.layout import model_lora_layout
from sluice.runtime.lora.manager import LoraConfig, LoraManager
from sluice.runtime.model.loader import load_model

pytestmark = pytest.mark.slow

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MAKERS = {
    "qwen3_moe": lambda p: make_tiny_qwen3_moe(p, seed=3, initializer_range=0.08),
    "mixtral": lambda p: make_tiny_mixtral(p, seed=4, initializer_range=0.08),
    "gpt_oss": lambda p: make_tiny_windowed(p, "gpt_oss", seed=5),
    "gemma3": lambda p: make_tiny_windowed(p, "gemma3", seed=6),
    "gemma2": lambda p: make_tiny_windowed(p, "gemma2", seed=8),
    "qwen3": lambda p: make_tiny_qwen3(p, seed=7),
    # Gemma 3 4B+'s form, served as text: PEFT adapts its vision tower's q/k/v/o too (those
    # adapter weights do not apply to text and are skipped)
    "gemma3_mm": lambda p: make_tiny_gemma3_multimodal(p / "mm", seed=9),
}
CASES = {
    "qwen3_moe-attention": ("qwen3_moe", ATTENTION),
    "mixtral-attention": ("mixtral", ATTENTION),
    "gpt_oss-attention": ("gpt_oss", ATTENTION),
    "gemma3-all": ("gemma3", ALL_TARGETS),
    "gemma2-all": ("gemma2", ALL_TARGETS),
    "qwen3-all": ("qwen3", ALL_TARGETS),
    "gemma3_multimodal-attention": ("gemma3_mm", ATTENTION),
}
PROMPTS = [[5, 17, 33, 42, 9, 11, 60, 61], [100, 7, 3, 250, 31]]
NEW = 6
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: make(tmp_path_factory.mktemp(name)) for name, make in MAKERS.items()}


def _manager(base: Path) -> tuple[torch.nn.Module, LoraManager]:
    model, _ = load_model(base, "cpu", torch.float32, attention_backend="torch")
    config = LoraConfig(max_loras=1, max_rank=8)
    return model, LoraManager(config, model, model_lora_layout(model), "cpu", torch.float32)


def _ours(model, manager, rows: list[tuple[list[int], int]]) -> tuple[torch.Tensor, list[list[int]]]:
    """Each row's last-prompt-token logits and `NEW` greedy tokens, all rows in one batch
    (`rows`: prompt, lora id; 0 is the base model)."""
    session = PagedSession(model)
    reqs = session.add_requests(len(rows))
    manager.prepare([(len(p), lora) for p, lora in rows])
    first = model.forward(session.batch(ForwardMode.EXTEND, [(r, p) for r, (p, _) in
                                                             zip(reqs, rows, strict=True)]))  # fmt: skip
    tokens = [[t] for t in first.argmax(-1).tolist()]
    for _ in range(NEW - 1):
        manager.prepare([(1, lora) for _, lora in rows])
        logits = model.forward(session.decode_batch(reqs, [t[-1] for t in tokens]))
        for out, t in zip(tokens, logits.argmax(-1).tolist(), strict=True):
            out.append(t)
    return first, tokens


@torch.no_grad()
def _peft(base: Path, adapter: Path | None, prompt: list[int]) -> tuple[torch.Tensor, list[int]]:
    """PEFT's (transformers' without `adapter`) last-token logits and greedy tokens."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32,
                                                 attn_implementation="eager")  # fmt: skip
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    ids, first = list(prompt), None
    for _ in range(NEW):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        first = logits if first is None else first
        ids.append(int(logits.argmax()))
    assert first is not None
    return first, ids[len(prompt) :]


@pytest.mark.parametrize("case", CASES)
def test_a_mixed_batch_gives_each_row_pefts_logits_and_tokens(case, bases, tmp_path) -> None:
    family, targets = CASES[case]
    base = bases[family]
    adapter = make_adapter(base, tmp_path / "adapter", rank=8, seed=1, targets=targets)
    model, manager = _manager(base)
    manager.register(1, "a", str(adapter))
    rows = [(PROMPTS[0], 1), (PROMPTS[0], 0), (PROMPTS[1], 1)]
    first, tokens = _ours(model, manager, rows)
    for i, (prompt, lora) in enumerate(rows):
        logits, greedy = _peft(base, adapter if lora else None, prompt)
        error = (first[i] - logits).abs().max().item()
        assert error <= TOLERANCE, (i, error)
        assert tokens[i] == greedy, (i, tokens[i], greedy)
    # the adapter changes the logits (else this test could not fail)
    assert (first[0] - first[1]).abs().max().item() > 100 * TOLERANCE


def _add_tensors(adapter: Path, extra: dict[str, torch.Tensor], targets: list[str]) -> None:
    from safetensors.torch import load_file, save_file

    file = adapter / "adapter_model.safetensors"
    save_file({**load_file(str(file)), **extra}, str(file))
    cfg_file = adapter / "adapter_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["target_modules"] = sorted({*cfg["target_modules"], *targets})
    cfg_file.write_text(json.dumps(cfg))


def test_pefts_adapter_on_the_experts_is_refused_naming_them(bases, tmp_path) -> None:
    base = bases["qwen3_moe"]
    # PEFT turns gate/up/down into `target_parameters` on the fused expert weights
    adapter = make_adapter(base, tmp_path / "adapter", rank=8, seed=2, targets=ALL_TARGETS)
    _, manager = _manager(base)
    with pytest.raises(LoraAdapterError, match=r"target_parameters .*gate_up_proj.*: LoRA on "
                       r"expert weights is not supported \(Qwen3MoeForCausalLM adapts q_proj, "
                       r"k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj\)"):  # fmt: skip
        manager.register(1, "experts", str(adapter))
    assert manager.registered == {}


def test_an_adapter_on_an_expert_layers_mlp_is_refused_naming_the_module(bases, tmp_path) -> None:
    base = bases["qwen3_moe"]  # layers 0 and 2 have experts, layer 1 a dense MLP
    adapter = make_adapter(base, tmp_path / "adapter", rank=8, seed=2, targets=ATTENTION)
    prefix = "base_model.model.model.layers.0.mlp.experts.0.gate_proj"  # transformers 4's name
    _add_tensors(adapter, {f"{prefix}.lora_A.weight": torch.zeros(8, 64),
                           f"{prefix}.lora_B.weight": torch.zeros(32, 8)}, ["gate_proj"])  # fmt: skip
    _, manager = _manager(base)
    with pytest.raises(LoraAdapterError, match=r"'mlp\.experts\.0\.gate_proj' of layer 0 has no "
                       r"LoRA slot: Qwen3MoeForCausalLM adapts q_proj, k_proj, v_proj, o_proj "
                       r"there"):  # fmt: skip
        manager.register(1, "mlp", str(adapter))
    assert manager.registered == {}


@pytest.mark.parametrize("family, expert", [("mixtral", "w1"), ("gpt_oss", "gate_up_proj")])
def test_an_adapter_listing_expert_modules_is_refused_naming_them(bases, tmp_path, family,
                                                                 expert) -> None:  # fmt: skip
    base = bases[family]
    adapter = make_adapter(base, tmp_path / "adapter", rank=8, seed=2, targets=ATTENTION)
    _add_tensors(adapter, {}, [expert])
    _, manager = _manager(base)
    with pytest.raises(LoraAdapterError, match=f"target module\\(s\\) {expert} are not in this "
                       "model's LoRA targets .*: q_proj, k_proj, v_proj, o_proj\\)"):  # fmt: skip
        manager.register(1, "experts", str(adapter))
