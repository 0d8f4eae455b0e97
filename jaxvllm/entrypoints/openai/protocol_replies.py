"""The server's replies as pydantic models, with the fields and names the OpenAI SDK reads
(and vLLM's extras: stop_reason, reasoning_content, prompt_logprobs). Replies are dumped
with exclude_unset: a field the server did not set is left out (a stream delta carries only
what changed), one it set to None is sent as null."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class ReplyModel(BaseModel):
    def model_post_init(self, context: Any) -> None:
        # A reply's kind ("object": "chat.completion", "type": "function", a message's role)
        # is always sent.
        self.__pydantic_fields_set__ |= {name for name in ("object", "type", "role")
                                         if name in type(self).model_fields
                                         and type(self).model_fields[name].default is not None}

    def dump(self) -> dict:
        return self.model_dump(exclude_unset=True)


class UsageInfo(ReplyModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int) -> "UsageInfo":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens)


class FunctionCall(ReplyModel):
    name: str
    arguments: str


class ToolCall(ReplyModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(ReplyModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(ReplyModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatMessageReply(ReplyModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatCompletionResponseChoice(ReplyModel):
    index: int
    message: ChatMessageReply
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(ReplyModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_logprobs: list | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill engine's, for the decode engine


class DeltaMessage(ReplyModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatCompletionStreamChoice(ReplyModel):
    index: int
    delta: DeltaMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionStreamResponse(ReplyModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatCompletionStreamChoice]
    usage: UsageInfo | None = None


class CompletionResponseChoice(ReplyModel):
    index: int
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list | None = None


class CompletionResponse(ReplyModel):
    """A whole completion, and (object "text_completion" too, as OpenAI streams it) a chunk."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill engine's, for the decode engine


class ModelCard(ReplyModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "jaxvllm"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(ReplyModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
