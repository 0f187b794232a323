"""Stop strings, checked in the scheduler so a request stops generating at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.scheduler.request import Req
from sluice.runtime.stop_match import first_stop, stop_pattern


@dataclass
class StopStringMatcher:
    """Decodes the tail of a request's output and looks for a stop string ending in it.

    A character is at most 4 bytes and a byte-level token at least one byte, so a stop
    string of n characters that ends in the newest token lies within the last 4n + 1
    tokens; older matches were found earlier. (The detokenizer checks the full text too.)
    """

    decode_text: Callable[[list[int], bool], str]  # (ids, skip_special_tokens) -> text

    def check(self, req: Req) -> None:
        sampling = req.sampling
        n = len(req.output_ids)
        if n < sampling.min_new_tokens:
            return
        start = max(0, n - (4 * max(len(s) for s in sampling.stop) + 1))
        window = req.output_ids[start:]
        tail = self.decode_text(window, sampling.skip_special_tokens)
        # with min_tokens, a match must end in the min_tokens-th token's text or later
        before = sampling.min_new_tokens - 1 - start
        floor = len(self.decode_text(window[:before], sampling.skip_special_tokens)) if before > 0 else 0
        found = first_stop(stop_pattern(sampling.stop), tail, 0, floor)
        if found is not None:
            req.finish(FinishReason("stop", matched_str=found[1]))
