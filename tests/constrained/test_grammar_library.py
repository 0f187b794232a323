"""The grammar library's contract, on the tiny test tokenizer: validation errors carry
xgrammar's reason, compilation is cached per constraint, the batch mask helper handles a
model vocabulary larger or smaller than the tokenizer's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import EOS_TOKEN_ID, make_tokenizer  # noqa: E402

from sluice.runtime.constrained import (  # noqa: E402
    GrammarCompiler,
    GrammarError,
    GrammarMatcher,
    allocate_token_bitmask,
    apply_token_bitmask,
    fill_token_bitmask,
    validate,
)
from sluice.runtime.constrained import spec as S  # noqa: E402
from sluice.runtime.ipc.messages import Constraint  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def compiler(tokenizer):
    c = GrammarCompiler(tokenizer, len(tokenizer), [EOS_TOKEN_ID])
    yield c
    c.close()


@pytest.mark.parametrize(
    "constraint, reason",
    [
        (Constraint("json_schema", '{"type": "object", "properties": 5}'), "properties"),
        (Constraint("json_schema", '{"type": '), "not valid JSON"),
        (Constraint("regex", "(unclosed"), "parenthesis"),
        (Constraint("ebnf", "root ::= undefined_rule"), "undefined_rule"),
        (Constraint("lark", "start: ("), ""),
        (Constraint("choice", "[]"), "non-empty"),
        (Constraint("choice", '["a", 3]'), "strings"),
        (Constraint("yaml", "x"), "unknown kind"),
    ],
)
def test_a_constraint_the_library_refuses_raises_its_reason(constraint, reason):
    with pytest.raises(GrammarError) as info:
        validate(constraint)
    assert info.value.kind == constraint.kind and reason in info.value.reason
    assert "/project/" not in info.value.reason  # no C++ source location


def test_guided_grammar_is_ebnf_with_rules_and_lark_otherwise():
    assert S.grammar('root ::= "a"').kind == "ebnf"
    assert S.grammar('start: "a"').kind == "lark"
    validate(S.grammar('start: "a" | "b"'))


def test_compilation_is_cached_per_constraint(compiler):
    a = compiler.compile_async(S.json_schema({"type": "integer"}))
    b = compiler.compile_async(S.json_schema({"type": "integer"}))
    c = compiler.compile_async(S.json_schema({"type": "integer"}, strict=False))
    assert a is b and a is not c
    assert a.result().compile_seconds >= 0


def test_a_failed_compilation_raises_from_the_future(compiler):
    future = compiler.compile_async(Constraint("regex", "[z-a]"))
    with pytest.raises(GrammarError):
        future.result()


def _accepts(compiler, tokenizer, constraint, text) -> bool:
    m = GrammarMatcher(compiler.compile(constraint))
    return all(m.accept_token(t) for t in tokenizer.encode(text)) and m.is_completed()


def test_choices_match_exactly_including_non_ascii(compiler, tokenizer):
    c = S.choice(["café 🙂", 'quote " and \\ slash'])
    assert _accepts(compiler, tokenizer, c, "café 🙂")
    assert _accepts(compiler, tokenizer, c, 'quote " and \\ slash')
    assert not _accepts(compiler, tokenizer, c, "café")


def test_strict_decides_whether_undeclared_properties_are_allowed(compiler, tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    extra = '{"a": 1, "b": 2}'
    assert not _accepts(compiler, tokenizer, S.json_schema(schema, strict=True), extra)
    assert _accepts(compiler, tokenizer, S.json_schema(schema, strict=False), extra)
    assert _accepts(compiler, tokenizer, S.json_schema(schema), '{"a": 1}')


def test_a_refused_token_leaves_the_state_unchanged(compiler, tokenizer):
    m = GrammarMatcher(compiler.compile(Constraint("regex", "ab")))
    (a,) = tokenizer.encode("a")
    (z,) = tokenizer.encode("z")
    assert m.accept_token(a) and not m.accept_token(z)
    assert m.num_accepted == 1
    with pytest.raises(ValueError):
        m.rollback(2)


def test_the_mask_allows_exactly_the_grammar_and_stop_only_at_the_end(compiler, tokenizer):
    m = GrammarMatcher(compiler.compile(Constraint("regex", "ab")))
    vocab = compiler.vocab_size
    bitmask = allocate_token_bitmask(2, vocab)
    logits = torch.zeros(2, vocab)
    rows = fill_token_bitmask([None, m], bitmask)
    apply_token_bitmask(logits, bitmask, rows)
    assert rows == [1] and bool(torch.isfinite(logits[0]).all())  # row 0 untouched
    allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
    assert all(tokenizer.decode([t]) and "ab".startswith(tokenizer.decode([t])) for t in allowed)
    assert EOS_TOKEN_ID not in allowed
    for t in tokenizer.encode("ab"):
        assert m.accept_token(t)
    bitmask = allocate_token_bitmask(1, vocab)
    logits = torch.zeros(1, vocab)
    apply_token_bitmask(logits, bitmask, fill_token_bitmask([m], bitmask))
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS_TOKEN_ID]
    assert m.accept_token(EOS_TOKEN_ID) and m.is_terminated()


@pytest.mark.parametrize("extra", [40, -3])
def test_a_model_vocab_unlike_the_tokenizers_is_masked_consistently(tokenizer, extra):
    """Padded logits (model vocab > tokenizer) never win; a model vocab shorter than the
    tokenizer's works on its own width."""
    vocab = len(tokenizer) + extra
    compiler = GrammarCompiler(tokenizer, vocab, [EOS_TOKEN_ID])
    m = GrammarMatcher(compiler.compile(Constraint("regex", "[a-z]+")))
    bitmask = allocate_token_bitmask(1, compiler.vocab_size)
    logits = torch.full((1, vocab), 0.0)
    logits[0, -1] = 100.0  # a padding id (or the last real one) as the unmasked favourite
    apply_token_bitmask(logits, bitmask, fill_token_bitmask([m], bitmask))
    if extra > 0:
        assert not bool(torch.isfinite(logits[0, len(tokenizer) :]).any())
    assert m.accept_token(int(logits.argmax(-1)))
    wider = torch.zeros(1, bitmask.shape[-1] * 32 + 7)  # a model wider than the bitmask
    apply_token_bitmask(wider, bitmask, [0])
    assert not bool(torch.isfinite(wider[0, bitmask.shape[-1] * 32 :]).any())
    compiler.close()


def test_any_of_takes_the_answer_in_its_format_or_a_framed_call(compiler, tokenizer):
    answer = S.json_schema({"type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a"], "additionalProperties": False})  # fmt: skip
    call = S.json_schema({"type": "object", "properties": {
        "name": {"type": "string", "enum": ["f"]},
        "arguments": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    }, "required": ["name", "arguments"]})  # fmt: skip
    c = S.any_of([[answer], ["<tool_call>\n", call, "\n</tool_call>"]])
    validate(c)
    assert _accepts(compiler, tokenizer, c, '{"a": 1}')
    assert _accepts(compiler, tokenizer, c, '<tool_call>\n{"name": "f", "arguments": {"x": "y"}}\n</tool_call>')
    assert not _accepts(compiler, tokenizer, c, "plain text")
    assert not _accepts(compiler, tokenizer, c, '<tool_call>\n{"name": "g", "arguments": {"x": "y"}}\n</tool_call>')
    assert not _accepts(compiler, tokenizer, c, '{"name": "f", "arguments": {"x": "y"}}')
    with pytest.raises(GrammarError):
        validate(Constraint("any_of", '[["text", {"kind": "regex", "spec": "("}]]'))
