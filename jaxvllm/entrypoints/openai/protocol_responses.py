"""OpenAI's Responses API (POST /v1/responses): the request, the output items and the typed
stream events, with the fields the OpenAI SDK reads. Input items stay dicts here and are
checked one by one (serving_responses.py), so that a bad one gets a 400 naming
`input[i].field`."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from jaxvllm.entrypoints.openai.protocol import OpenAIBaseModel
from jaxvllm.entrypoints.openai.protocol_replies import ReplyModel


class ResponsesFunctionTool(OpenAIBaseModel):
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesNamedToolChoice(OpenAIBaseModel):
    type: Literal["function"]
    name: str


class ResponsesTextFormat(OpenAIBaseModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponsesTextConfig(OpenAIBaseModel):
    format: ResponsesTextFormat | None = None


class ResponsesRequest(OpenAIBaseModel):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[ResponsesFunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ResponsesNamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # None: true
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: ResponsesTextConfig | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's, e.g. enable_thinking


class ResponsesModel(ReplyModel):
    """Responses objects are sent whole: every field, defaults included."""

    def dump(self) -> dict:
        return self.model_dump()


class ReasoningText(ResponsesModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(ResponsesModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[dict] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


class OutputText(ResponsesModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict] = Field(default_factory=list)
    logprobs: list[dict] = Field(default_factory=list)


class OutputMessage(ResponsesModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallItem(ResponsesModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = ReasoningItem | OutputMessage | FunctionCallItem


class ResponseUsage(ResponsesModel):
    input_tokens: int
    input_tokens_details: dict[str, int] = Field(
        default_factory=lambda: {"cached_tokens": 0, "cache_write_tokens": 0})
    output_tokens: int
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})
    total_tokens: int


class ResponsesResponse(ResponsesModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    model: str
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    output: list[OutputItem]
    error: dict | None = None
    incomplete_details: dict | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict]
    tool_choice: Any
    parallel_tool_calls: bool
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None
    store: bool
    text: dict
    usage: ResponseUsage | None = None
