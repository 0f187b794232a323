"""Constrained decoding end to end, without the scheduler: transformers' forward of the
bundled SmolLM2, the token bitmask applied at each greedy step, the matcher advanced with
each token. The oracles: `json.loads` + `jsonschema`, `re.fullmatch`, the choice list."""

from __future__ import annotations

import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")
jsonschema = pytest.importorskip("jsonschema")

from json_schemas import COUNTS, PERSON, PETS  # noqa: E402

from sluice.runtime.constrained import (  # noqa: E402
    GrammarCompiler,
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask,
    fill_token_bitmask,
)
from sluice.runtime.constrained import spec as S  # noqa: E402
from sluice.runtime.ipc.messages import Constraint  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.bundled]
MAX_TOKENS = 64

class Decoder:
    """Greedy decoding of a chat prompt with transformers, masked by a GrammarMatcher."""

    def __init__(self, path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.compiler = GrammarCompiler(
            self.tok, self.model.config.vocab_size, [self.tok.eos_token_id]
        )

    def prompt_ids(self, question: str) -> list[int]:
        messages = [{"role": "user", "content": question}]
        text = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tok.encode(text)

    @torch.no_grad()
    def run(self, question: str, constraint: Constraint) -> tuple[list[int], GrammarMatcher]:
        """The generated ids (the final stop token excluded) and the matcher."""
        matcher = GrammarMatcher(self.compiler.compile(constraint))
        bitmask = allocate_token_bitmask(1, self.compiler.vocab_size)
        ids = torch.tensor([self.prompt_ids(question)])
        cache, out = None, []
        for _ in range(MAX_TOKENS):
            result = self.model(input_ids=ids, cache=cache, use_cache=True)
            cache = result.past_key_values
            logits = result.logits[:, -1, :].clone()
            apply_token_bitmask(logits, bitmask, fill_token_bitmask([matcher], bitmask))
            token = int(logits.argmax(-1))
            assert matcher.accept_token(token), f"masked argmax {token} refused"
            if matcher.is_terminated():
                return out, matcher
            out.append(token)
            ids = torch.tensor([[token]])
        pytest.fail(f"no complete match in {MAX_TOKENS} tokens: {self.tok.decode(out)!r}")

    def text(self, ids: list[int]) -> str:
        return self.tok.decode(ids)


@pytest.fixture(scope="module")
def decoder(bundled_model_path) -> Decoder:
    return Decoder(bundled_model_path)


@pytest.mark.parametrize(
    "question, schema",
    [
        ("Describe a person who lives in Paris, as JSON.", PERSON),
        ("Which pets do you like? Answer in JSON.", PETS),
        ("Count to two, as JSON.", COUNTS),
    ],
    ids=["nested-object", "enum-array", "integers"],
)
def test_json_schema_output_parses_and_validates(decoder, question, schema):
    ids, _ = decoder.run(question, S.json_schema(schema))
    value = json.loads(decoder.text(ids))
    jsonschema.validate(value, schema)


def test_strict_schema_forbids_undeclared_properties_and_json_object_allows_any(decoder):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    ids, _ = decoder.run("Is water wet? JSON please.", S.json_schema(schema, strict=True))
    assert set(json.loads(decoder.text(ids))) == {"ok"}
    loose = GrammarMatcher(decoder.compiler.compile(Constraint("json_object", "")))
    assert all(loose.accept_token(t) for t in decoder.tok.encode('{"any": [1, "x"]}'))
    assert loose.is_completed()


def test_a_choice_answer_is_one_of_the_choices(decoder):
    choices = ["Paris", "London", "Berlin"]
    ids, _ = decoder.run("What is the capital of France?", S.choice(choices))
    assert decoder.text(ids) in choices


def test_a_regex_answer_matches(decoder):
    pattern = r"The answer is [0-9]{1,3}\."
    ids, _ = decoder.run("What is 2+2?", Constraint("regex", pattern))
    assert re.fullmatch(pattern, decoder.text(ids))


def test_rollback_then_reaccept_gives_the_same_state(decoder):
    text = '{"name": "Ann", "age": 30, "address": {"city": "Paris", "zip": 75001}}'
    ids = decoder.tok.encode(text)
    vocab = decoder.compiler.vocab_size
    matcher = GrammarMatcher(decoder.compiler.compile(S.json_schema(PERSON)))
    before = allocate_token_bitmask(1, vocab)
    after = allocate_token_bitmask(1, vocab)
    half = len(ids) // 2
    for t in ids[:half]:
        assert matcher.accept_token(t)
    matcher.fill_next_token_bitmask(before, 0)
    for t in ids[half:]:
        assert matcher.accept_token(t)
    assert matcher.is_completed()
    matcher.rollback(len(ids) - half)
    assert matcher.num_accepted == half and not matcher.is_completed()
    matcher.fill_next_token_bitmask(after, 0)
    assert torch.equal(before, after)
    for t in ids[half:]:
        assert matcher.accept_token(t)
    assert matcher.is_completed() and matcher.accept_token(decoder.tok.eos_token_id)
    assert matcher.is_terminated()
