"""A /v1/responses request's `input`, `tools` and `tool_choice` in chat terms: input items
become chat messages for the template (a `function_call` joins the assistant turn before
it, a `function_call_output` is a `tool` message; reasoning items are not replayed), and
the flat function tools become chat tools, so chat's checks and parsers serve both APIs."""
from __future__ import annotations

from types import SimpleNamespace

from jaxvllm.entrypoints.openai.errors import APIError
from jaxvllm.entrypoints.openai.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionToolsParam,
    FunctionDefinition,
    FunctionName,
)

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


def _string(item: dict, key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(f"{param}.{key} must be a string.", 400, f"{param}.{key}")
    return value


def _text(content, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{param} must be a string or a list of text parts.", 400, param)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            raise APIError(f"{param}[{j}]: only parts of type input_text or output_text are "
                           f"supported.", 400, f"{param}[{j}].type")
        texts.append(_string(part, "text", f"{param}[{j}]"))
    return "\n".join(texts)


def input_messages(input_) -> list[dict]:
    """Chat messages (dicts ChatMessage accepts) for the request's own input."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    out: list[dict] = []
    for i, item in enumerate(input_):
        param = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(f"{param}.role must be one of {', '.join(ROLES)}; got {role!r}.",
                               400, f"{param}.role")
            out.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", param), "type": "function", "function": {
                "name": _string(item, "name", param), "arguments": _string(item, "arguments", param)}}
            if out and out[-1]["role"] == "assistant":
                out[-1] = {**out[-1], "tool_calls": [*out[-1].get("tool_calls", []), call]}
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": _string(item, "call_id", param),
                        "content": _text(item.get("output"), f"{param}.output")})
        elif kind != "reasoning":
            raise APIError(f"{param}.type {kind!r} is not supported: use message, function_call, "
                           f"function_call_output or reasoning.", 400, f"{param}.type")
    return out


def as_chat_request(request) -> SimpleNamespace:
    """What tool_choice.plan_tools reads from a chat request."""
    tools = None
    if request.tools:
        tools = []
        for i, t in enumerate(request.tools):
            if t.type != "function":
                raise APIError(f"tools[{i}].type {t.type!r} is not supported: only function tools.",
                               400, f"tools[{i}].type")
            if not t.name:
                raise APIError(f"tools[{i}].name is required.", 400, f"tools[{i}].name")
            tools.append(ChatCompletionToolsParam(function=FunctionDefinition(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)))
    choice = request.tool_choice
    if isinstance(choice, str) or choice is None:
        chat_choice = choice
    else:
        chat_choice = ChatCompletionNamedToolChoiceParam(function=FunctionName(name=choice.name))
    fmt = request.text.format if request.text else None
    return SimpleNamespace(tools=tools, tool_choice=chat_choice,
                           parallel_tool_calls=request.parallel_tool_calls, structured_outputs=None,
                           response_format=fmt if fmt is not None and fmt.type != "text" else None)


def responses_param(e: APIError) -> APIError:
    """Chat's field names in Responses' spelling (tools[i].function.x -> tools[i].x)."""
    fix = lambda s: s.replace(".function.", ".") if s else s
    return APIError(fix(e.message), e.status, fix(e.param))
