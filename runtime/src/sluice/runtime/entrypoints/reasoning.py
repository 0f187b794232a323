"""`--reasoning-parser`: a reasoning model's thinking, separated from its answer.

`qwen3`: the text between `<think>` and `</think>` is `reasoning_content`, what follows is
`content` (the newlines after `</think>` dropped). Output that does not open with `<think>`
is all content (Qwen3 with `enable_thinking: false`: its template puts an empty think block
in the prompt, so the reply has none), as SGLang's and vLLM's `qwen3` parsers do. A reply cut
short inside the block is all reasoning.

When the prompt itself ends inside an open `<think>` (the Qwen3-2507 Thinking template,
and DeepSeek-R1's, open the block for the model), the reply starts in the reasoning and has
no opening tag: `prompt_opens_thinking` tells, and the splitter starts `opened`.

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


def prompt_opens_thinking(prompt_tail: str) -> bool:
    """The prompt (its last characters will do) leaves a `<think>` block open."""
    tail = prompt_tail.rstrip()
    return tail.endswith(THINK_OPEN)


def split_reasoning(text: str, opened: bool = False) -> ReasoningSplit:
    """A whole reply's reasoning and content (`qwen3`); `opened`: the prompt opened it."""
    splitter = ReasoningSplitter.starting(opened)
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
    strip_leading: bool = False  # opened by the prompt: drop the reasoning's leading newlines

    @classmethod
    def starting(cls, opened: bool) -> ReasoningSplitter:
        """`opened`: the prompt ended inside `<think>`: the reply starts in the reasoning
        (its leading newlines dropped, as the template's own newline separates them)."""
        return cls(state="reasoning", strip_leading=True) if opened else cls()

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
            if self.strip_leading:  # opened by the prompt: a repeated <think> is dropped
                text = text.lstrip("\n")
                if THINK_OPEN.startswith(text) and text != THINK_OPEN:  # maybe "<think>"
                    self.held = text
                    return ReasoningSplit("", "")
                if text.startswith(THINK_OPEN):
                    text = text[len(THINK_OPEN) :].lstrip("\n")
                self.strip_leading = not text
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
