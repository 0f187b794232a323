"""POST /tokenize and POST /detokenize, as vLLM serves them.

/tokenize takes a `prompt` (special tokens added unless `add_special_tokens: false`) or chat
`messages` (the chat template applied as /v1/chat/completions applies it: same tools,
`add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`), and answers
`{count, max_model_len, tokens, token_strs}` (`token_strs` with `return_token_strs`).
/detokenize takes `tokens` and answers `{prompt}`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import Field

from sluice.runtime.entrypoints.errors import ProtocolError
from sluice.runtime.entrypoints.json_types import Bool, TokenId
from sluice.runtime.entrypoints.openai_protocol import (
    ChatCompletionRequest,
    ChatMessage,
    RequestBody,
)
from sluice.runtime.entrypoints.request_params import check_token_ids
from sluice.runtime.entrypoints.serving_base import ServingBase
from sluice.runtime.entrypoints.tools import ToolDef


class TokenizeRequest(RequestBody):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    add_special_tokens: Bool | None = None  # prompt: true; messages: false (the template has them)
    add_generation_prompt: Bool = True
    continue_final_message: Bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None
    return_token_strs: Bool = False

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise ProtocolError("give exactly one of prompt and messages", param="prompt")


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[TokenId]

    def check(self) -> None:
        pass


class ServingTokenize(ServingBase):
    async def tokenize(self, request: Request) -> Response:
        req = await self.parse(request, TokenizeRequest)
        self.check_model(req.model)
        if req.messages is not None:
            fields = req.model_dump(
                include={"messages", "add_generation_prompt", "continue_final_message",
                         "chat_template", "chat_template_kwargs", "tools"},
                exclude_none=True, by_alias=True,
            )  # fmt: skip
            fields["add_special_tokens"] = bool(req.add_special_tokens)
            chat = ChatCompletionRequest.model_validate(fields)
            chat.check()
            ids = await self.off_loop(self.chat_prompt, chat)
        else:
            special = req.add_special_tokens is not False
            ids = await self.off_loop(self.encode, req.prompt or "", special)
        body: dict[str, Any] = {
            "count": len(ids),
            "max_model_len": self.tm.context_len,
            "tokens": ids,
            "token_strs": self.tm.tokenizer.convert_ids_to_tokens(ids) if req.return_token_strs else None,
        }
        return JSONResponse(body)

    async def detokenize(self, request: Request) -> Response:
        req = await self.parse(request, DetokenizeRequest)
        self.check_model(req.model)
        check_token_ids(req.tokens, self.tm.vocab_size, "tokens")
        text = await self.off_loop(self.tm.tokenizer.decode, req.tokens)
        return JSONResponse({"prompt": text})
