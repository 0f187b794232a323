"""Stop strings, checked in the scheduler so a request stops generating at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.runtime.ipc.messages import FinishReason
from sluice.runtime.scheduler.request import Req


@dataclass
class StopStringMatcher:
    """Decodes the tail of a request's output and looks for a stop string ending in it.

    A character is at most 4 bytes and a byte-level token at least one byte, so a stop
    string of n characters that ends in the newest token lies within the last 4n + 1
    tokens; older matches were found earlier. (The detokenizer checks the full text too.)
    """

    decode_text: Callable[[list[int], bool], str]  # (ids, skip_special_tokens) -> text

    def check(self, req: Req) -> None:
        if len(req.output_ids) < req.sampling.min_new_tokens:
            return
        window = 4 * max(len(s) for s in req.sampling.stop) + 1
        tail = self.decode_text(req.output_ids[-window:], req.sampling.skip_special_tokens)
        for stop in req.sampling.stop:
            if stop and stop in tail:
                req.finish(FinishReason("stop", matched_str=stop))
                return
