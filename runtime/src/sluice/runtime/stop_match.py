"""Stop strings found in one pass, for the scheduler (a token window) and the detokenizer
(the whole text): one compiled alternation instead of one search per string.

`first_stop` returns the leftmost occurrence (the first-listed string among those starting
there, as a loop over the strings would) whose end lies past `floor`: with `min_tokens`, a
stop string ending in text produced before the `min_tokens`-th token does not count.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence


@functools.lru_cache(maxsize=1024)
def _compiled(stops: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(s) for s in stops))


def stop_pattern(stops: Sequence[str]) -> re.Pattern[str] | None:
    """The compiled alternation of `stops` (None for no stop string)."""
    stops = tuple(s for s in stops if s)
    return _compiled(stops) if stops else None


def first_stop(pattern: re.Pattern[str] | None, text: str, start: int = 0,
               floor: int = 0) -> tuple[int, str] | None:  # fmt: skip
    """(index, stop string) of the leftmost match in `text[start:]` ending after `floor`."""
    if pattern is None:
        return None
    pos = start
    while (match := pattern.search(text, pos)) is not None:
        if match.end() > floor:
            return match.start(), match.group()
        pos = match.start() + 1
    return None
