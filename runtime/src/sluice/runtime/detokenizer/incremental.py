"""Incremental detokenization of one request's output: text deltas and stop strings.

Pure and process-free: the Detokenizer process keeps one `IncrementalDetokenizer` per
request and feeds it each batch of new token ids.

Decoding uses the prefix/read offset window of vLLM and SGLang: the newest tokens are
decoded together with the few tokens before them (`prefix_offset:`), and the delta is what
that adds to the text of the older tokens alone (`prefix_offset:read_offset`). A window
whose text ends in U+FFFD is an incomplete multi-byte character, so it is held until the
next token completes it. When the request finishes, the whole output is decoded once, so
the deltas add up to `tokenizer.decode(all_ids)` whenever the tokenizer's decoding is
prefix-stable.

`spaces_between_special_tokens=False` (vLLM) writes each added token (special or not) as
its raw content, so the tokenizer's decoder puts no space around it; True (the default)
is the tokenizer's own decoding.

Stop strings (OpenAI semantics): the text is cut before the first stop string, which is not
included; a tail that could still grow into a stop string is held back, so no delta ever
contains text past a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from sluice.runtime.stop_match import first_stop, stop_pattern

REPLACEMENT_CHAR = "\ufffd"


class DetokDelta(NamedTuple):
    text: str  # new text, safe to show the user
    matched_stop: str | None  # the stop string that ended the text, when one did


class IncrementalDetokenizer:
    """Turns one request's token ids, arriving in batches, into text deltas.

    Invariants: `text[:sent]` has been emitted; `text` only grows (it is cut once, at a
    stop string, and then frozen); no stop string occurs in `text[:sent]`, and no suffix of
    `text[:sent]` longer than the held-back tail is a prefix of a stop string.
    """

    def __init__(
        self,
        tokenizer: Any,
        skip_special_tokens: bool = True,
        stop_strings: Iterable[str] = (),
        spaces_between_special_tokens: bool = True,
        min_tokens: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.min_tokens = min_tokens
        # the text's length before the `min_tokens`-th token: a stop string ending there or
        # earlier does not count (vLLM's and OpenAI's `min_tokens`); None until known
        self._stop_floor: int | None = 0 if min_tokens <= 1 else None
        self.skip_special_tokens = skip_special_tokens
        self.spaces_between_special_tokens = spaces_between_special_tokens
        self._added: dict[int, str] = {}
        self._special: set[int] = set()
        if not spaces_between_special_tokens:
            self._added = {i: t for t, i in tokenizer.get_added_vocab().items()}
            self._special = set(tokenizer.all_special_ids)
        self.stop_strings = [s for s in dict.fromkeys(stop_strings) if s]
        self._max_stop_len = max((len(s) for s in self.stop_strings), default=0)
        self._stop_pattern = stop_pattern(self.stop_strings)
        self.ids: list[int] = []
        self.text = ""  # decoded text so far (complete characters only, until finished)
        self.sent = 0  # characters of `text` already emitted
        self.prefix_offset = 0
        self.read_offset = 0
        self.matched_stop: str | None = None
        # of the ids fed in the call that found a stop string, how many led up to it (the
        # rest are not part of the output)
        self.ids_before_stop: int | None = None
        self.finished = False

    @property
    def output_text(self) -> str:
        """Everything emitted so far."""
        return self.text[: self.sent]

    def add(
        self, new_ids: list[int], finished: bool = False, matched_stop: str | None = None
    ) -> DetokDelta:
        """Feed new token ids; returns the text that may now be shown.

        `finished`: the request ended, flush everything held back (but never a stop
        string). `matched_stop`: the stop string the scheduler saw, if it ended the request
        on one; the text is cut there even if this class's own search did not find it.
        After a stop string was matched, or after `finished`, further calls return "".
        """
        if self.finished or self.matched_stop is not None:
            return DetokDelta("", None)
        self.ids.extend(new_ids)
        checked_from = self.sent
        if finished:
            self._decode_all()
        else:
            self._decode_window()

        cut = self._find_stop(checked_from)
        if cut is None and finished and matched_stop:
            idx = self.text.find(matched_stop, checked_from)
            if idx >= 0:
                cut = (idx, matched_stop)
        if cut is not None:
            idx, stop = cut
            self.ids_before_stop = self._ids_up_to(len(new_ids), idx + len(stop))
            self.text = self.text[:idx]
            self.matched_stop = stop
            self.finished = True
            return self._emit(idx, stop)
        if finished:
            self.finished = True
            return self._emit(len(self.text), None)
        return self._emit(len(self.text) - self._held_back(), None)

    # --- decoding -------------------------------------------------------------------------
    def _decode(self, ids: list[int]) -> str:
        if not self._added:
            return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)
        parts, run = [], []
        for t in ids:
            if t not in self._added:
                run.append(t)
                continue
            if run:
                parts.append(self.tokenizer.decode(run, skip_special_tokens=self.skip_special_tokens))
                run = []
            if not (self.skip_special_tokens and t in self._special):
                parts.append(self._added[t])
        if run:
            parts.append(self.tokenizer.decode(run, skip_special_tokens=self.skip_special_tokens))
        return "".join(parts)

    def _decode_window(self) -> None:
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) > len(prefix_text) and not new_text.endswith(REPLACEMENT_CHAR):
            self.text += new_text[len(prefix_text) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)

    def _decode_all(self) -> None:
        full = self._decode(self.ids)
        if full.startswith(self.text):
            self.text = full
        else:  # decoding is not prefix-stable here: keep what was sent, add the window
            prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
            new_text = self._decode(self.ids[self.prefix_offset :])
            self.text += new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset = len(self.ids)

    # --- stop strings ---------------------------------------------------------------------
    def _find_stop(self, start: int) -> tuple[int, str] | None:
        """The earliest stop string in `text[start:]` ending past the `min_tokens` floor, as
        (index, stop); every stop string in one pass."""
        if self._stop_pattern is None:
            return None
        if self._stop_floor is None:
            if len(self.ids) < self.min_tokens:
                return None
            self._stop_floor = len(self._decode(self.ids[: self.min_tokens - 1]))
        return first_stop(self._stop_pattern, self.text, start, self._stop_floor)

    def _ids_up_to(self, num_new: int, text_end: int) -> int:
        """How many of the last `num_new` ids it takes for the text to reach `text_end`
        characters (the tokens after the one completing a stop string are not output)."""
        base = len(self.ids) - num_new
        for j in range(1, num_new):
            if len(self._decode(self.ids[: base + j])) >= text_end:
                return j
        return num_new

    def _held_back(self) -> int:
        """Length of the longest unsent suffix of `text` that begins some stop string."""
        longest = min(self._max_stop_len - 1, len(self.text) - self.sent)
        for k in range(longest, 0, -1):
            tail = self.text[-k:]
            if any(stop.startswith(tail) for stop in self.stop_strings):
                return k
        return 0

    def _emit(self, end: int, stop: str | None) -> DetokDelta:
        end = max(end, self.sent)
        delta = self.text[self.sent : end]
        self.sent = end
        return DetokDelta(delta, stop)
