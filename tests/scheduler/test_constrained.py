"""Constrained decoding through the real scheduler: whatever the (random) model prefers, the
output is in the constraint's language, in both loops, chunked, batched, under retraction.

The oracle is the constraint itself: `re.fullmatch`, membership in the choices, and
`jsonschema` on the parsed output; and, with deterministic inference, retraction and the
overlap loop change no constrained output.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from tiny_model import make_tokenizer

from sluice.runtime.ipc.messages import Constraint

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 9},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "ok"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "maybe later"]
REGEX = r"[0-9]{3}-[a-c]{2}"

CASES = {
    "choice": (Constraint("choice", json.dumps(CHOICES)), lambda text: text in CHOICES),
    "regex": (Constraint("regex", REGEX), lambda text: re.fullmatch(REGEX, text) is not None),
    "json_schema": (
        Constraint("json_schema", json.dumps(SCHEMA)),
        lambda text: jsonschema.validate(json.loads(text), SCHEMA) is None,
    ),
}


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def submit_all(h, n: int = 6, prompt_len: int = 4):
    for i in range(n):
        for name, (constraint, _) in CASES.items():
            prompt = [7 + i, 8 + (3 * i) % 50, 9, 10 + i % 7]
            prompt += [(11 + 5 * i + j) % 60 + 3 for j in range(prompt_len - len(prompt))]
            h.submit(f"{name}{i}", prompt, max_new_tokens=64, constraint=constraint)


def check_outputs(h, tokenizer, n: int = 6):
    for i in range(n):
        for name, (_, valid) in CASES.items():
            rid = f"{name}{i}"
            ids = h.outputs[rid]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            assert h.finished[rid].kind == "stop", (rid, h.finished[rid], text)
            assert valid(text), (rid, text)


@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_every_constrained_output_is_in_its_language(make_harness, tokenizer, overlap):
    h = make_harness(disable_overlap_schedule=not overlap, max_running_requests=24)
    submit_all(h)
    h.run_until_idle()
    check_outputs(h, tokenizer)


def test_chunked_prompts_in_a_small_pool_keep_the_constraint(make_harness, tokenizer):
    h = make_harness(disable_overlap_schedule=False, max_running_requests=24,
                     max_total_tokens=96, chunked_prefill_size=8,
                     init_new_token_ratio=0.05)  # fmt: skip
    submit_all(h, prompt_len=12)  # 12 tokens: a prompt not served from the cache takes 2 chunks
    h.run_until_idle()
    check_outputs(h, tokenizer)
    # retraction under constraints is the next test's; here prompts were really chunked
    assert h.scheduler.counters.prefill_rows > len(CASES) * 6


def test_retraction_and_overlap_change_no_constrained_output(make_harness):
    runs = []
    for overlap, pool in ((False, 4096), (True, 4096), (True, 160)):
        h = make_harness(enable_deterministic_inference=True, disable_overlap_schedule=not overlap,
                         max_running_requests=24, max_total_tokens=pool,
                         init_new_token_ratio=0.05)  # fmt: skip
        submit_all(h)
        h.run_until_idle()
        runs.append((h.outputs, h.scheduler.counters.retractions_total))
    (base, _), (overlap, _), (tight, retractions) = runs
    assert overlap == base and tight == base
    assert retractions > 0


def test_an_unconstrained_request_in_the_same_batch_is_untouched(make_harness):
    alone = make_harness()
    alone.submit("free", [5, 6, 7], max_new_tokens=12, ignore_eos=True)
    alone.run_until_idle()
    h = make_harness(disable_overlap_schedule=False)
    submit_all(h, n=2)
    h.submit("free", [5, 6, 7], max_new_tokens=12, ignore_eos=True)
    h.run_until_idle()
    assert h.outputs["free"] == alone.outputs["free"]
