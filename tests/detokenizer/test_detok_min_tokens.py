"""`min_tokens` holds back stop strings as vLLM does: a stop string counts only once the
request has `min_tokens` tokens, and only if it ends in the `min_tokens`-th token's text or
later; one that ended earlier stays in the output. In the detokenizer (the whole text) and
in the scheduler's token-window check alike."""

from __future__ import annotations

from sluice.runtime.detokenizer import IncrementalDetokenizer
from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.scheduler.request import Req
from sluice.runtime.scheduler.stop_strings import StopStringMatcher
from sluice.runtime.stop_match import first_stop, stop_pattern

TEXT = "One. Two. Three. Four. Five. Six. Seven. Eight."


def _ids_and_ends(tokenizer):
    """The ids of TEXT, and each prefix's text length (where token i's text ends)."""
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    ends = [len(tokenizer.decode(ids[: i + 1])) for i in range(len(ids))]
    return ids, ends


def _stopped_at(tokenizer, min_tokens: int) -> tuple[int, str]:
    """(tokens fed when the stop matched, the text emitted)."""
    ids, _ = _ids_and_ends(tokenizer)
    detok = IncrementalDetokenizer(tokenizer, stop_strings=[".", "\n"], min_tokens=min_tokens)
    for n, token in enumerate(ids, 1):
        detok.add([token])
        if detok.matched_stop is not None:
            return n, detok.output_text
    raise AssertionError("no stop string matched")


def test_without_min_tokens_the_first_period_stops(tokenizer):
    n, text = _stopped_at(tokenizer, 0)
    assert text == "One"


def test_a_stop_string_before_min_tokens_does_not_count(tokenizer):
    ids, ends = _ids_and_ends(tokenizer)
    min_tokens = 8
    n, text = _stopped_at(tokenizer, min_tokens)
    assert n >= min_tokens
    # the text runs to the first period that ends in token min_tokens or later
    floor = ends[min_tokens - 2]
    first = TEXT.index(".", floor - len(".") + 1) if floor else TEXT.index(".")
    assert text == TEXT[:first]
    assert text.startswith("One. Two")  # the periods before min_tokens stay in the text


def test_one_pass_matching_takes_the_leftmost_then_the_first_listed():
    pattern = stop_pattern(["lo", "hello", "he"])
    assert first_stop(pattern, "say hello") == (4, "hello")  # leftmost start wins
    assert first_stop(stop_pattern(["he", "hello"]), "say hello") == (4, "he")
    assert first_stop(pattern, "say hello", floor=6) == (4, "hello")  # ends past the floor
    assert first_stop(stop_pattern(["l"]), "hello", floor=3) == (3, "l")  # overlaps skipped
    assert first_stop(stop_pattern([]), "anything") is None


def test_the_schedulers_window_check_honours_min_tokens(tokenizer):
    ids, ends = _ids_and_ends(tokenizer)
    matcher = StopStringMatcher(lambda t, skip: tokenizer.decode(t, skip_special_tokens=skip))
    min_tokens = 6  # the 6th token's text is inside "Two": a period ended before, none in it
    params = SamplingParams(max_new_tokens=64, stop=[".", "\n"], min_new_tokens=min_tokens)
    req = Req("r", [1, 2], params)
    finished_at = None
    for n, token in enumerate(ids, 1):
        req.output_ids.append(token)
        matcher.check(req)
        if req.finish_reason is not None:
            finished_at = n
            break
    # it finished on the token whose text completes the first period ending in the
    # min_tokens-th token's text or later, not at min_tokens on the earlier "One."
    period = TEXT.index(".", ends[min_tokens - 2])
    expected = next(n for n in range(1, len(ids) + 1) if ends[n - 1] > period)
    assert TEXT.index(".") < ends[min_tokens - 2] and expected > min_tokens  # the case bites
    assert finished_at == expected
    assert req.finish_reason.matched_str == "."
