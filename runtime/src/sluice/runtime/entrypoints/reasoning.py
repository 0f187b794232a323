"""`--reasoning-parser`: a reasoning model's thinking, separated from its answer.

`qwen3`: the text between `<think>` and `</think>` is `reasoning_content`, what follows is
`content` (the newlines after `</think>` dropped). Output that does not open with `<think>`
is all content (Qwen3 with `enable_thinking: false`: its template puts an empty think block
in the prompt, so the reply has none), as SGLang's and vLLM's `qwen3` parsers do. A reply cut
short inside the block is all reasoning.

`ReasoningSplitter.feed` does the same for a stream: each text delta gives a reasoning
delta and a content delta; a tag split across deltas is held back until it is whole.
"""

from __future__ import annotations

from dataclasses import dataclass

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningSplit:
    reasoning: str
    content: str


def split_reasoning(text: str) -> ReasoningSplit:
    """A whole reply's reasoning and content (`qwen3`)."""
    splitter = ReasoningSplitter()
    first, last = splitter.feed(text), splitter.finish()
    return ReasoningSplit(first.reasoning + last.reasoning, first.content + last.content)


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that starts `tag` (a tag cut by the delta)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ReasoningSplitter:
    """Streaming `qwen3` splitter: `feed` each delta, `finish` at the end."""

    state: str = "start"  # start (nothing seen), reasoning, content
    held: str = ""  # text not yet emitted: a possible tag prefix, or the undecided start
    strip_newlines: bool = False  # drop the newlines right after </think>

    def feed(self, delta: str) -> ReasoningSplit:
        text = self.held + delta
        self.held = ""
        reasoning, content = "", ""
        if self.state == "start":
            stripped = text.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.state, text = "reasoning", stripped[len(THINK_OPEN) :]
            elif THINK_OPEN.startswith(stripped):  # still could be "<think>"
                self.held = text
                return ReasoningSplit("", "")
            else:  # no think block: all content
                self.state = "content"
        if self.state == "reasoning":
            end = text.find(THINK_CLOSE)
            if end >= 0:
                reasoning, text = text[:end], text[end + len(THINK_CLOSE) :]
                self.state, self.strip_newlines = "content", True
            else:
                cut = _partial_suffix(text, THINK_CLOSE)
                reasoning, self.held = text[: len(text) - cut], text[len(text) - cut :]
                return ReasoningSplit(reasoning, "")
        if self.strip_newlines:
            text = text.lstrip("\n")
            self.strip_newlines = not text
        content = text
        return ReasoningSplit(reasoning, content)

    def finish(self) -> ReasoningSplit:
        """What is still held when the reply ends."""
        held, self.held = self.held, ""
        if self.state == "reasoning":
            return ReasoningSplit(held, "")
        return ReasoningSplit("", held)  # start: a reply shorter than "<think>"
