"""Mixed-adapter batches through the real scheduler and model worker, against PEFT.

Random adapters of rank 8 and 16 (non-zero B) on a tiny Llama; PEFT's greedy
`generate` on the same fp32 base weights is the oracle for every row."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import PeftOracle, make_adapter

pytestmark = pytest.mark.slow

PROMPTS = [[5, 17, 33, 42, 9, 11], [60, 61, 62, 63, 64, 65, 66, 67, 68], [100, 7, 3]]
NEW = 10


@pytest.fixture(scope="module")
def adapters(tiny_llama_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a8": make_adapter(tiny_llama_path, root / "a8", rank=8, seed=1),
        "b16": make_adapter(tiny_llama_path, root / "b16", rank=16, seed=2, use_rslora=True),
    }


@pytest.fixture(scope="module")
def oracle(tiny_llama_path: Path) -> PeftOracle:
    return PeftOracle(tiny_llama_path)


def _modules(adapters: dict[str, Path]) -> tuple[str, ...]:
    return tuple(f"{name}={path}" for name, path in adapters.items())


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_mixed_batch_rows_each_match_their_peft_oracle(
    make_harness, adapters, oracle, overlap: bool
) -> None:
    h = make_harness(
        enable_lora=True, lora_modules=_modules(adapters), max_loras=2,
        disable_overlap_schedule=not overlap,
    )  # fmt: skip
    ids = {None: 0, "a8": 1, "b16": 2}
    jobs = [(f"r{i}-{name}", prompt, name) for i, prompt in enumerate(PROMPTS) for name in ids]
    for rid, prompt, name in jobs:
        h.submit(rid, prompt, max_new_tokens=NEW, ignore_eos=True, lora_id=ids[name])
    h.run_until_idle()
    for rid, prompt, name in jobs:
        want = oracle.generate(adapters[name] if name else None, prompt, NEW)
        assert h.outputs[rid] == want, (rid, h.outputs[rid], want)
    # the adapters change the answers (else this test could not fail)
    for i in range(len(PROMPTS)):
        assert h.outputs[f"r{i}-a8"] != h.outputs[f"r{i}-None"]
        assert h.outputs[f"r{i}-b16"] != h.outputs[f"r{i}-a8"]


def test_retraction_under_a_small_pool_keeps_every_rows_oracle_output(
    make_harness, adapters, oracle
):
    h = make_harness(
        enable_lora=True, lora_modules=_modules(adapters), max_loras=2, max_total_tokens=72,
        max_running_requests=6,
    )  # fmt: skip
    ids = {None: 0, "a8": 1, "b16": 2}
    jobs = [(f"r{i}-{name}", prompt, name) for i, prompt in enumerate(PROMPTS[:2]) for name in ids]
    for rid, prompt, name in jobs:
        h.submit(rid, prompt, max_new_tokens=20, ignore_eos=True, lora_id=ids[name])
    h.run_until_idle()
    assert h.scheduler.counters.retractions_total > 0
    for rid, prompt, name in jobs:
        assert h.outputs[rid] == oracle.generate(adapters[name] if name else None, prompt, 20), rid


def test_a_batch_never_holds_more_adapters_than_max_loras_and_nobody_starves(
    make_harness, adapters, oracle
):
    h = make_harness(enable_lora=True, lora_modules=_modules(adapters), max_loras=1)
    ids = {None: 0, "a8": 1, "b16": 2}
    order = ["a8", "b16", None, "a8", "b16", "a8"]
    lora_of = {}
    for i, name in enumerate(order):
        rid = f"q{i}-{name}"
        lora_of[rid] = ids[name]
        h.submit(rid, PROMPTS[i % 3], max_new_tokens=6, ignore_eos=True, lora_id=ids[name])
    h.run_until_idle()
    for tick in h.ticks:
        assert len({lora_of[r] for r in tick.rids} - {0}) <= 1, tick.rids
    for i, name in enumerate(order):  # every request finished, each with its own output
        rid = f"q{i}-{name}"
        assert h.outputs[rid] == oracle.generate(
            adapters[name] if name else None, PROMPTS[i % 3], 6
        )


def test_two_adapters_never_share_cached_pages_for_the_same_prompt(make_harness, adapters):
    h = make_harness(enable_lora=True, lora_modules=_modules(adapters), max_loras=2)
    prompt = list(range(40, 72))
    for rid, lora in (
        ("a-first", 1),
        ("b-same-prompt", 2),
        ("base-same-prompt", 0),
        ("a-again", 1),
    ):
        h.submit(rid, prompt, max_new_tokens=2, ignore_eos=True, lora_id=lora)
        h.run_until_idle()
    assert h.cached["b-same-prompt"] == 0
    assert h.cached["base-same-prompt"] == 0
    assert h.cached["a-again"] == len(prompt) - 1  # the same adapter does reuse its pages
