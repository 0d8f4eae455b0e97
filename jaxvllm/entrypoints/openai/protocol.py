"""Request bodies of the OpenAI-compatible API, with OpenAI's and vLLM's field names.

Unknown fields are ignored (clients in the wild send many); known fields are type-checked
by pydantic in strict mode, as OpenAI's API checks them (`true` is no count and `"5"` no
number; -> HTTP 400 naming the field), and range-checked by SamplingParams.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

from jaxvllm.entrypoints.openai.legacy_guided import LegacyGuidedFields
from jaxvllm.entrypoints.openai.strict_schema import strict_schema
from jaxvllm.sampling_params import SamplingParams, StructuredOutputsParams

_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    # Messages for union-typed fields, clearer than pydantic's one-per-member list.
    field_hints: ClassVar[dict[str, str]] = {
        "prompt": "must be a string, a list of strings, a list of token ids or a list of "
                  "token-id lists.",
        "stop": "must be a string or a list of strings.",
        "messages[].content": "must be a string or a list of {\"type\": \"text\", \"text\": ...} parts.",
        "tool_choice": "must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}.",
    }


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class JsonSchemaResponseFormat(OpenAIBaseModel):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's response_format: "text", "json_object" or "json_schema"."""
    type: str
    json_schema: JsonSchemaResponseFormat | None = None

    def to_structured_outputs(self) -> StructuredOutputsParams | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            if self.json_schema is None or self.json_schema.schema_ is None:
                raise ValueError("response_format.json_schema.schema is required for type json_schema.")
            schema = self.json_schema.schema_
            if self.json_schema.strict:
                schema = strict_schema(schema, "response_format.json_schema.schema")
            return StructuredOutputsParams(json=schema)
        raise ValueError(f"response_format.type must be text, json_object or json_schema; "
                         f"got {self.type!r}.")


class SamplingRequestBase(OpenAIBaseModel, LegacyGuidedFields):
    """Fields shared by completions and chat completions."""
    model: str | None = None
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extra sampling parameters.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_logprobs: int | None = None
    priority: int = 0
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None  # vLLM's: json, regex, choice, grammar
    # vLLM's: a KV connector's orders (disaggregated prefill: the proxy's, the prefill engine's reply).
    kv_transfer_params: dict[str, Any] | None = None

    def _sampling_kwargs(self, max_tokens: int, logprobs: int | None,
                         prompt_logprobs: int | None) -> dict[str, Any]:
        given = {
            "n": self.n, "seed": self.seed, "stop": self.stop, "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
            "allowed_token_ids": self.allowed_token_ids, "bad_words": self.bad_words,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
            "max_tokens": max_tokens, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty, "logprobs": logprobs,
            "prompt_logprobs": prompt_logprobs,
            "logit_bias": ({int(k): v for k, v in self.logit_bias.items()}
                           if self.logit_bias else None),
            "extra_args": ({"kv_transfer_params": self.kv_transfer_params}
                           if self.kv_transfer_params is not None else None),
        }
        structured = self.legacy_structured_outputs() or self.structured_outputs
        if structured is not None:
            try:
                given["structured_outputs"] = StructuredOutputsParams(**structured)
            except TypeError as e:
                raise ValueError(f"structured_outputs: {e}.") from e
        elif self.response_format is not None:
            given["structured_outputs"] = self.response_format.to_structured_outputs()
        return {k: v for k, v in given.items() if v is not None}

    def to_sampling_params(self, max_tokens: int, logprobs: int | None = None,
                           prompt_logprobs: int | None = None, **extra) -> SamplingParams:
        """Raises ValueError (-> 400) on bad values, or when a non-default value asks for a
        feature this build's SamplingParams does not have."""
        if self.logit_bias:
            bad = [k for k in self.logit_bias if not k.lstrip("-").isdigit()]
            if bad:
                raise ValueError(f"logit_bias keys must be token ids; got {bad[:3]}.")
        kwargs = self._sampling_kwargs(max_tokens, logprobs, prompt_logprobs) | extra
        neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}
        for name in [k for k in kwargs if k not in _SAMPLING_FIELDS]:
            if kwargs[name] == neutral.get(name, object()) or kwargs[name] == {}:
                del kwargs[name]
            else:
                raise ValueError(f"{name} is not supported by this server's sampler yet.")
        return SamplingParams(**kwargs)


class CompletionRequest(SamplingRequestBase):
    prompt: Union[list[int], list[list[int]], str, list[str]]
    echo: bool = False
    logprobs: int | None = None
    max_tokens: int | None = 16
    max_completion_tokens: int | None = None
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True
    use_beam_search: bool = False  # vLLM's: beam width n, returns the n best beams
    length_penalty: float = 1.0


class ChatContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of type object
    strict: bool | None = None


class ChatCompletionToolsParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class FunctionName(OpenAIBaseModel):
    name: str


class ChatCompletionNamedToolChoiceParam(OpenAIBaseModel):
    type: Literal["function"] = "function"
    function: FunctionName


class FunctionCallParam(OpenAIBaseModel):
    name: str
    arguments: str


class ToolCallParam(OpenAIBaseModel):
    """A call of an earlier assistant turn, sent back by the client."""
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[ChatContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # role "assistant"
    tool_call_id: str | None = None  # role "tool": the call this is the result of


class ChatCompletionRequest(SamplingRequestBase):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None  # honoured only with --trust-request-chat-template
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: Literal["none", "auto", "required"] | ChatCompletionNamedToolChoiceParam | None = None
    parallel_tool_calls: bool | None = None  # None: true, as in OpenAI's API


class TokenizeRequest(OpenAIBaseModel):
    """vLLM's /tokenize: either `prompt` or chat `messages`."""
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None  # rendered as chat completions render them
    return_token_strs: bool = False


class DetokenizeRequest(OpenAIBaseModel):
    model: str | None = None
    tokens: list[int]
