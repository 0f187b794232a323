"""Mixed-adapter batches through the real scheduler and model worker, against PEFT.

Random adapters of rank 8 and 16 (non-zero B) on a tiny Llama; PEFT's greedy
`generate` on the same fp32 base weights is the oracle for every row."""

from __future__ import annotations

from pathlib import Path

import pytest
from lora_adapters import PeftOracle, make_adapter

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
