"""IncrementalDetokenizer: deltas add up to the full decode, never split a character,
never run past a stop string."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.runtime.detokenizer import IncrementalDetokenizer

EMOJI_TEXT = "Hi 🙂 and 🚀, café, 日本語."


def feed(detok, ids, sizes=None):
    """Feed `ids` in pieces; return the deltas, the last one marked finished."""
    sizes = sizes or [1] * len(ids)
    deltas, pos = [], 0
    for size in sizes:
        piece = ids[pos : pos + size]
        pos += size
        deltas.append(detok.add(piece, finished=pos >= len(ids)).text)
        if pos >= len(ids):
            break
    return deltas


def test_deltas_concatenate_to_the_full_decode(tokenizer):
    ids = tokenizer.encode("The quick brown fox. " + EMOJI_TEXT, add_special_tokens=False)
    deltas = feed(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids)


def test_a_character_split_across_tokens_never_yields_a_replacement_char(tokenizer):
    ids = tokenizer.encode(EMOJI_TEXT, add_special_tokens=False)
    # precondition: some token alone is an incomplete UTF-8 sequence
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    deltas = feed(IncrementalDetokenizer(tokenizer), ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == EMOJI_TEXT


def test_an_incomplete_character_at_the_end_is_flushed_as_decode_gives_it(tokenizer):
    ids = tokenizer.encode("ok 🙂", add_special_tokens=False)[:-1]  # cut inside the emoji
    deltas = feed(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert deltas[-1].endswith("\ufffd")


@settings(max_examples=60, deadline=None)
@given(text=st.text(min_size=1, max_size=60), seed=st.integers(0, 2**16))
def test_any_text_in_any_chunking_round_trips(tokenizer, text, seed):
    ids = tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(seed)
    sizes = [rng.randint(1, 4) for _ in ids]
    deltas = feed(IncrementalDetokenizer(tokenizer), ids, sizes)
    assert "".join(deltas) == tokenizer.decode(ids)


def test_special_tokens_are_skipped_or_kept_as_asked(tokenizer):
    ids = tokenizer.encode("hello", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert "".join(feed(IncrementalDetokenizer(tokenizer, True), ids)) == "hello"
    kept = "".join(feed(IncrementalDetokenizer(tokenizer, False), ids))
    assert kept == "hello<|im_end|>"


def test_text_is_cut_before_a_stop_string(tokenizer):
    ids = tokenizer.encode("The capital of France is Paris. It is big.", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["Paris"])
    deltas, matched = [], None
    for i in ids:
        delta = detok.add([i])
        deltas.append(delta.text)
        if delta.matched_stop:
            matched = delta.matched_stop
            break
    assert matched == "Paris"
    assert "".join(deltas) == "The capital of France is "
    assert detok.output_text == "The capital of France is "


def test_no_delta_runs_past_the_start_of_a_stop_string(tokenizer):
    text = "one two three four five"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["four five six"])
    emitted = ""
    for i in ids:
        emitted += detok.add([i]).text
        # the text so far ends in a prefix of the stop string: it is held back
        assert "four" not in emitted
    emitted += detok.add([], finished=True).text
    assert emitted == text  # the stop never completed: all of it is flushed at the end


def test_a_stop_string_inside_one_token_cuts_inside_it(tokenizer):
    ids = tokenizer.encode("Paris. It", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["is. "])
    out = "".join(detok.add([i]).text for i in ids)
    assert out == "Par"
    assert detok.matched_stop == "is. "


def test_the_earliest_of_several_stop_strings_wins(tokenizer):
    ids = tokenizer.encode("alpha beta gamma", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["gamma", "beta"])
    delta = detok.add(ids)
    assert delta == ("alpha ", "beta")


def test_nothing_is_emitted_after_a_stop(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["b"])
    assert detok.add(tokenizer.encode("a b", add_special_tokens=False)).matched_stop == "b"
    assert detok.add(tokenizer.encode(" more", add_special_tokens=False), finished=True) == (
        "",
        None,
    )


def test_a_stop_split_across_multibyte_tokens_is_found(tokenizer):
    ids = tokenizer.encode("go 🚀 now", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["🚀"])
    out = "".join(detok.add([i]).text for i in ids)
    assert out == "go "
    assert detok.matched_stop == "🚀"


def test_the_schedulers_stop_string_cuts_the_final_text(tokenizer):
    # the scheduler saw the stop first and finished the request in the same batch
    ids = tokenizer.encode("Hello, world! Bye", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["!"])
    delta = detok.add(ids, finished=True, matched_stop="!")
    assert delta == ("Hello, world", "!")


def test_the_schedulers_stop_string_is_honoured_without_our_own_list(tokenizer):
    ids = tokenizer.encode("Hello, world! Bye", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer)
    assert detok.add(ids[:2]).text == tokenizer.decode(ids[:2])
    final = detok.add(ids[2:], finished=True, matched_stop="!")
    assert detok.output_text == "Hello, world"
    assert final.matched_stop == "!"


def test_empty_stop_strings_are_ignored(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, stop_strings=["", "zzz"])
    ids = tokenizer.encode("abc", add_special_tokens=False)
    assert detok.add(ids, finished=True) == ("abc", None)


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(min_size=2, max_size=50),
    start=st.integers(0, 49),
    length=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_any_stop_string_cuts_at_its_first_occurrence_and_nothing_runs_past_it(
    tokenizer, text, start, length, seed
):
    start = start % len(text)
    stop = text[start : start + length]
    expected = text[: text.index(stop)]
    ids = tokenizer.encode(text, add_special_tokens=False)
    rng = random.Random(seed)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=[stop])
    emitted, pos = "", 0
    while pos < len(ids):
        size = rng.randint(1, 3)
        delta = detok.add(ids[pos : pos + size], finished=pos + size >= len(ids))
        pos += size
        emitted += delta.text
        assert expected.startswith(emitted)  # never past the stop string
        if delta.matched_stop:
            break
    assert emitted == expected and detok.matched_stop == stop
