"""Logprob formatting as pure functions over hand-made positions. Oracles: the bytes of
the tokens add up to the UTF-8 of the decoded text; byte-fallback tokens are their byte."""

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("xgrammar")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_model import make_tokenizer  # noqa: E402

from sluice.runtime.entrypoints.logprobs import (  # noqa: E402
    PositionLogprobs,
    TokenBytes,
    chat_logprobs,
    completion_logprobs,
    generate_logprobs,
)


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def tb(tok):
    return TokenBytes.of(tok)


def byte_fallback_tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t in ["▁", "a", "▁a", "é"]:
        vocab[t] = len(vocab)
    t = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "a")], unk_token="<unk>", byte_fallback=True))
    t.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", eos_token="</s>")


def test_split_utf8_tokens_carry_their_own_bytes_which_add_up_to_the_text(tok, tb):
    text = "日本語 🙂 café"
    ids = tok.encode(text)
    assert any(tok.decode([i]).endswith("\ufffd") for i in ids)  # some tokens split a char
    positions = [PositionLogprobs(i, -1.0) for i in ids]
    content = chat_logprobs(tb, positions, 0).content
    assert b"".join(bytes(c.bytes) for c in content) == text.encode()
    split = [c for c in content if c.token.startswith("bytes:")]
    assert split and all("\\x" in c.token for c in split)
    assert all(bytes(c.bytes).decode() == c.token for c in content if c not in split)


def test_byte_fallback_tokens_are_their_byte():
    bf = byte_fallback_tokenizer()
    tb = TokenBytes.of(bf)
    ids = bf.encode("a 🙂é", add_special_tokens=False)
    pieces = [bytes(tb.bytes_of(i)) for i in ids]
    assert b"".join(pieces) == " a 🙂é".encode()  # the leading ▁ is a space byte
    emoji = [i for i in ids if bf.convert_ids_to_tokens(i).startswith("<0x")]
    assert [tb.bytes_of(i) for i in emoji] == [bytes([b]) for b in "🙂".encode()]
    assert tb.text_of(emoji[0]) == "bytes:\\xf0"


def test_chat_top_logprobs_are_the_k_best_in_order(tok, tb):
    a, b, c = tok.encode("a")[0], tok.encode("b")[0], tok.encode("c")[0]
    p = PositionLogprobs(b, math.log(0.3), [(a, math.log(0.6)), (b, math.log(0.3)), (c, -5.0)])
    (entry,) = chat_logprobs(tb, [p], 2).content
    assert (entry.token, entry.bytes) == ("b", [ord("b")])
    assert [(t.token, t.logprob, t.bytes) for t in entry.top_logprobs] == [
        ("a", math.log(0.6), [ord("a")]), ("b", math.log(0.3), [ord("b")])
    ]


def test_completion_logprobs_have_the_chosen_token_and_k_best(tok, tb):
    ids = tok.encode("Hi 🙂")
    positions = [PositionLogprobs(i, -0.1 * n, [(ids[0], -0.01)]) for n, i in enumerate(ids)]
    lp = completion_logprobs(tb, positions, 1, offset=3)
    assert lp.token_logprobs == [-0.1 * n for n in range(len(ids))]
    assert all(tb.text_of(i) in top for i, top in zip(ids, lp.top_logprobs, strict=True))
    assert lp.text_offset[0] == 3 and lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[-1] <= 3 + len("Hi 🙂")


def test_tokens_as_ids_and_generate_triples(tok, tb):
    ids = tok.encode("ab")
    positions = [PositionLogprobs(i, -1.0, [(i, -1.0)]) for i in ids]
    assert [c.token for c in chat_logprobs(tb.with_ids(True), positions, 0).content] == [
        f"token_id:{i}" for i in ids
    ]
    chosen, tops = generate_logprobs(tb, positions, 1, with_text=True)
    assert chosen == [[-1.0, i, tb.text_of(i)] for i in ids]
    assert tops == [[[-1.0, i, tb.text_of(i)]] for i in ids]
    assert generate_logprobs(tb, positions, 0, with_text=False) == ([[-1.0, i] for i in ids], None)
