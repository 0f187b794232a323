"""spaces_between_special_tokens: False writes added tokens as their raw content, so a
decoder that joins tokens with spaces (WordPiece) puts none around them."""

from sluice.runtime.detokenizer.incremental import IncrementalDetokenizer


def wordpiece_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "##s": 3}
    t = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.decoder = decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]")
    fast.add_special_tokens({"additional_special_tokens": ["<a>", "<b>"]})
    return fast


def _text(tok, ids, **kw):
    d = IncrementalDetokenizer(tok, **kw)
    out = "".join(d.add([t]).text for t in ids)
    return out + d.add([], finished=True).text


def test_special_tokens_without_spaces_when_asked():
    tok = wordpiece_tokenizer()
    a, b = tok.convert_tokens_to_ids(["<a>", "<b>"])
    ids = [1, a, b, 2]
    assert tok.decode(ids) == "hello <a> <b> world"
    assert _text(tok, ids, skip_special_tokens=False) == "hello <a> <b> world"
    no_spaces = _text(tok, ids, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert no_spaces == "hello<a><b>world"
    skipped = _text(tok, ids, skip_special_tokens=True, spaces_between_special_tokens=False)
    assert skipped == "helloworld"
