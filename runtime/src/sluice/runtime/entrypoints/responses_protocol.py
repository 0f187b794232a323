"""POST /v1/responses: the request model, and the rules that turn it into the chat request
the shared serving steps run (the Responses API is served as a chat completion of the
conversation it names; only its input and output shapes are its own).

Served: `input` (a string, or items: `message` with text parts, `function_call`,
`function_call_output`, `reasoning` — accepted and dropped, as chat templates drop earlier
turns' thinking), `instructions` (a system message in front, for this response only, as in
OpenAI), `max_output_tokens`, `temperature`, `top_p`, function `tools`, `tool_choice`,
`parallel_tool_calls`, `text.format` (text, json_object, json_schema with `strict`; a
turn whose tool_choice forces a call is the call, constrained by the tool's schema),
`reasoning.effort` (with --reasoning-parser; `none`/`minimal` turn thinking off through the
chat template's `enable_thinking`), `metadata`, `user`, `store`, `previous_response_id`,
`stream`, `background` (not streamed); vLLM's extras `top_k`, `min_p`, `repetition_penalty`, `seed`, `ignore_eos`.

Refused with a 400 naming the field: built-in tools (web search, file search, computer
use, code interpreter, image generation, MCP, shell, custom), image/file/audio inputs,
`item_reference` items, `background` with `stream`, `conversation`, `prompt` (stored prompt templates),
`truncation: auto`, `top_logprobs`, `include` beyond `reasoning.encrypted_content`
(answered without it: reasoning is returned as text), `max_tool_calls`,
`reasoning.summary` (no summarizer), `text.verbosity` other than medium.

Input items are read leniently (unknown keys ignored): they are often this server's own
output items replayed by a client SDK, which adds fields of newer API versions.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sluice.runtime.entrypoints.errors import ProtocolError, from_validation_error
from sluice.runtime.entrypoints.json_types import SEED_MAX, SEED_MIN, Bool, Float, Int
from sluice.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    JsonSchemaFormat,
    RequestBody,
    ResponseFormat,
    StrictObject,
)
from sluice.runtime.entrypoints.request_fields import COMMON_REFUSED, Refused
from sluice.runtime.entrypoints.tools import FunctionDef, FunctionName, NamedToolChoice, ToolDef

MAX_METADATA_KEYS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
THINKING_OFF_EFFORTS = ("none", "minimal")
# answered without it: reasoning is returned as text, nothing is encrypted
INCLUDABLE = ("reasoning.encrypted_content",)

RESPONSES_REFUSED: dict[str, Refused] = {
    **COMMON_REFUSED,
    "conversation": Refused("conversations are not built; continue with previous_response_id"),
    "prompt": Refused("stored prompt templates are not supported"),
    "max_tool_calls": Refused("max_tool_calls is not supported"),
    "top_logprobs": Refused("logprobs are not built for the Responses API (chat completions has them)"),
    "context_management": Refused("context management is not supported"),
}


class _Item(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Item):
    type: Literal["input_text", "output_text", "text", "refusal"]
    text: str = ""
    refusal: str | None = None

    @property
    def value(self) -> str:
        return self.refusal if self.type == "refusal" and self.refusal is not None else self.text


TEXT_PART_TYPES = ("input_text", "output_text", "text", "refusal")


def text_of(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.value for p in content)


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]

    @property
    def text(self) -> str:
        return text_of(self.content)


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]

    @property
    def text(self) -> str:
        return text_of(self.output)


class ReasoningInputItem(_Item):
    type: Literal["reasoning"]


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningInputItem
ITEM_TYPES: dict[str, type[_Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningInputItem,
}


def parse_item(raw: Any, index: int) -> InputItem:
    """One input item, validated; a 400 naming `input[i]...` for what is refused."""
    param = f"input[{index}]"
    if not isinstance(raw, dict):
        raise ProtocolError(f"{param} must be an object", param=param)
    kind = raw.get("type", "message" if "role" in raw else None)
    model = ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if model is None:
        what = "item_reference items are not supported (send the item itself)" if (
            kind == "item_reference"
        ) else f"input items of type {kind!r} are not supported"
        raise ProtocolError(f"{param}.type: {what}", param=f"{param}.type", code="unsupported_parameter")
    content = raw.get("content") if kind == "message" else raw.get("output")
    if isinstance(content, list):
        for j, part in enumerate(content):
            ptype = part.get("type") if isinstance(part, dict) else None
            if ptype not in TEXT_PART_TYPES:
                field = "content" if kind == "message" else "output"
                raise ProtocolError(
                    f"{param}.{field}[{j}].type: only text parts are supported "
                    f"({ptype!r}: images, files and audio are not; text-only models)",
                    param=f"{param}.{field}[{j}].type", code="unsupported_parameter",
                )  # fmt: skip
    try:
        return model.model_validate(raw)  # type: ignore[return-value]
    except ValidationError as exc:
        err = from_validation_error(exc)
        raise ProtocolError(f"{param}.{err.message}", param=f"{param}.{err.param}") from exc


class FunctionTool(StrictObject):
    type: Literal["function"]
    name: str = Field(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: Bool | None = None

    def as_chat_tool(self) -> ToolDef:
        return ToolDef(function=FunctionDef(
            name=self.name, description=self.description, parameters=self.parameters,
            strict=self.strict,
        ))  # fmt: skip


class FunctionChoice(StrictObject):
    type: Literal["function"]
    name: str


class TextFormat(StrictObject):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: Bool | None = None
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class TextConfig(StrictObject):
    format: TextFormat | None = None
    verbosity: str | None = None  # only "medium" is served (checked by the request)


class ReasoningConfig(StrictObject):
    # none/minimal turn thinking off; the others leave it on (no thinking budget is built)
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    summary: str | None = None  # no summarizer: a summary is refused (checked by the request)
    generate_summary: str | None = None


class ResponsesStreamOptions(StrictObject):
    include_obfuscation: Bool = False  # no effect: no obfuscation padding is added


class ResponsesRequest(RequestBody):
    REFUSED: ClassVar[dict[str, Refused]] = RESPONSES_REFUSED
    model: str | None = None
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: Int | None = Field(None, ge=1)
    temperature: Float | None = Field(None, ge=0.0, le=2.0)
    top_p: Float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: Bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    store: Bool = True
    previous_response_id: str | None = Field(None, min_length=1)
    stream: Bool = False
    background: Bool = False
    stream_options: ResponsesStreamOptions | None = None
    truncation: str | None = None  # "auto" is refused
    include: list[str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    # vLLM's extras
    top_k: Int | None = Field(None, ge=-1)
    min_p: Float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: Float | None = Field(None, gt=0.0)
    seed: Int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    ignore_eos: Bool = False
    request_id: str | None = Field(None, min_length=1)

    @field_validator("metadata")
    @classmethod
    def _metadata_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is not None:
            if len(value) > MAX_METADATA_KEYS:
                raise ValueError(f"at most {MAX_METADATA_KEYS} keys")
            for k, v in value.items():
                if len(k) > MAX_METADATA_KEY_CHARS or len(v) > MAX_METADATA_VALUE_CHARS:
                    raise ValueError(
                        f"keys of at most {MAX_METADATA_KEY_CHARS} characters, values of at "
                        f"most {MAX_METADATA_VALUE_CHARS}"
                    )
        return value

    def check(self) -> None:
        if isinstance(self.input, list) and not self.input:
            raise ProtocolError("input must not be empty", param="input")
        if self.background and not self.store:
            raise ProtocolError("background responses need store: true", param="background")
        if self.background and self.stream:
            raise ProtocolError(
                "streaming a background response is not built: create it, then poll GET "
                "/v1/responses/{id}", param="stream", code="unsupported_parameter",
            )  # fmt: skip
        if self.stream_options is not None and not self.stream:
            raise ProtocolError("stream_options can only be set when stream is true",
                                param="stream_options")  # fmt: skip
        self.function_tools()
        self.items()
        self._refuse_options()

    def _refuse_options(self) -> None:
        """The options of nested objects that are refused, each with its reason."""
        refused: list[tuple[str, bool, str]] = [
            ("truncation", self.truncation not in (None, "disabled"),
             "truncation auto is not built: a conversation longer than the context is refused"),
            ("include", any(i not in INCLUDABLE for i in self.include or []),
             f"only {', '.join(INCLUDABLE)} is accepted (logprobs and built-in tool outputs "
             "are not built)"),
            ("reasoning.summary", self.reasoning is not None and (
                self.reasoning.summary is not None or self.reasoning.generate_summary is not None),
             "reasoning summaries are not built (the reasoning item carries the thinking as text)"),
            ("text.verbosity", self.text is not None and self.text.verbosity not in (None, "medium"),
             "only medium: there is no verbosity control"),
        ]  # fmt: skip
        for param, bad, why in refused:
            if bad:
                raise ProtocolError(f"{param}: {why}", param=param, code="unsupported_parameter")

    def items(self) -> list[InputItem]:
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return [parse_item(raw, i) for i, raw in enumerate(self.input)]

    def function_tools(self) -> list[FunctionTool]:
        tools = []
        for i, raw in enumerate(self.tools or []):
            kind = raw.get("type") if isinstance(raw, dict) else None
            if kind != "function":
                raise ProtocolError(
                    f"tools[{i}].type: built-in tools ({kind!r}) are not supported; only "
                    "function tools", param=f"tools[{i}].type", code="unsupported_parameter",
                )  # fmt: skip
            try:
                tools.append(FunctionTool.model_validate(raw))
            except ValidationError as exc:
                err = from_validation_error(exc)
                raise ProtocolError(f"tools[{i}].{err.message}", param=f"tools[{i}]") from exc
        return tools

    @property
    def forces_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, FunctionChoice)

    @property
    def thinking_off(self) -> bool:
        return self.reasoning is not None and self.reasoning.effort in THINKING_OFF_EFFORTS

    def response_format(self) -> ResponseFormat | None:
        fmt = self.text.format if self.text is not None else None
        if fmt is None:
            return None
        if fmt.type == "json_schema":
            if fmt.schema_ is None:
                raise ProtocolError("text.format: json_schema needs schema", param="text.format")
            schema = JsonSchemaFormat(name=fmt.name, description=fmt.description,
                                      schema=fmt.schema_, strict=fmt.strict)  # fmt: skip
            return ResponseFormat(type="json_schema", json_schema=schema)
        return ResponseFormat(type=fmt.type)


ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco",
                    "reasoning": "rs"}  # fmt: skip


def input_item_records(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as GET /v1/responses/{id}/input_items lists them: each with
    an id (kept if the client gave one), a message's string content as one text part."""
    raw_items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    records = []
    for raw, item in zip(raw_items, req.items(), strict=True):
        record = {k: v for k, v in raw.items() if v is not None}
        record["type"] = item.type
        record.setdefault("id", f"{ITEM_ID_PREFIXES[item.type]}_{uuid.uuid4().hex}")
        record.setdefault("status", "completed")
        if isinstance(item, MessageItem):
            if isinstance(item.content, str):
                kind = "output_text" if item.role == "assistant" else "input_text"
                record["content"] = [{"type": kind, "text": item.content}]
        records.append(record)
    return records


def conversation_messages(items: list[InputItem]) -> list[dict[str, Any]]:
    """The chat messages the items stand for: function calls join the assistant message
    before them (one message with content and tool_calls, as chat has it), their outputs
    are tool messages, `developer` is `system` (the templates know that role)."""
    messages: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": item.text})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text})
    return messages


def chat_request(
    req: ResponsesRequest, conversation: list[dict[str, Any]], model: str, reasoning_parser: str
) -> ChatCompletionRequest:
    """The chat completion the shared steps run for `req`: the `conversation` (the stored
    one `previous_response_id` names, then this input's messages) after the instructions."""
    if req.reasoning is not None and req.reasoning.effort is not None and not reasoning_parser:
        raise ProtocolError(
            "reasoning.effort needs a reasoning model served with --reasoning-parser",
            param="reasoning.effort", code="unsupported_parameter",
        )  # fmt: skip
    messages = list(conversation)
    if req.instructions:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise ProtocolError("input has no message to answer", param="input")
    choice = req.tool_choice
    fields: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_completion_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tools": [t.as_chat_tool() for t in req.function_tools()] or None,
        "tool_choice": NamedToolChoice(function=FunctionName(name=choice.name))
        if isinstance(choice, FunctionChoice) else choice,
        "parallel_tool_calls": req.parallel_tool_calls,
        # a forced call's output is the call, whose grammar the tool's schema makes: the
        # text format governs text, and there is none this turn (OpenAI allows both)
        "response_format": None if req.forces_call else req.response_format(),
        "top_k": req.top_k,
        "min_p": req.min_p,
        "repetition_penalty": req.repetition_penalty,
        "seed": req.seed,
        "ignore_eos": req.ignore_eos,
        "chat_template_kwargs": {"enable_thinking": False} if req.thinking_off else None,
    }
    try:
        chat = ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        raise from_validation_error(exc) from exc
    chat.check()
    return chat
