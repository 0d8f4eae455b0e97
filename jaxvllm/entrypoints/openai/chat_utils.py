"""A chat request's messages to prompt token ids, off the event loop.

The model's own chat template renders (and tokenizes) in a worker thread: a long
conversation must not stall the server's other requests. A template the request brings
(`chat_template`, or `chat_template_kwargs.chat_template` as vLLM also reads it) is
refused unless the server trusts request templates; then it renders in the sandbox
process (chat_template_sandbox.py) with a time and size limit. `--chat-template` replaces
the model's own template for every request. Tools reach templates as `tools=` (OpenAI's
shape) and earlier calls as each assistant message's `tool_calls` with `arguments` parsed
into a dict, as transformers' tool-using templates expect (vLLM does the same).
"""
from __future__ import annotations

import asyncio
import json
import os

from jaxvllm.entrypoints.openai.chat_template_sandbox import ChatTemplateError, ChatTemplateSandbox
from jaxvllm.entrypoints.openai.errors import APIError

ROLES = ("system", "developer", "user", "assistant", "tool")


def conversation(messages) -> list[dict]:
    """Plain {"role", "content"} dicts; content parts are joined (text parts only)."""
    out = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise APIError(f"messages[{i}].role must be one of {', '.join(ROLES)}; got {m.role!r}.",
                           400, f"messages[{i}].role")
        content = m.content
        if isinstance(content, list):
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise APIError(f"messages[{i}].content[{j}]: only content parts of type 'text' "
                                   f"are supported; got type {part.type!r}.", 400,
                                   f"messages[{i}].content[{j}].type")
            content = "\n".join(part.text for part in content)
        message = {"role": m.role, "content": content or ""} | ({"name": m.name} if m.name else {})
        if m.tool_calls:
            message["tool_calls"] = [_template_call(c) for c in m.tool_calls]
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        out.append(message)
    return out


def _template_call(call) -> dict:
    try:
        arguments = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    return {"id": call.id, "type": "function",
            "function": {"name": call.function.name, "arguments": arguments}}


def load_chat_template(value: str | None) -> str | None:
    """--chat-template: a file's path, or the template itself (as vLLM reads it)."""
    if value is None:
        return None
    if os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    if "{{" in value or "{%" in value:
        return value
    raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template.")


def apply_chat_template(tokenizer, conv: list[dict], add_generation_prompt: bool = True,
                        continue_final_message: bool = False, kwargs: dict | None = None
                        ) -> list[int]:
    try:
        return list(tokenizer.apply_chat_template(
            conv, tokenize=True, return_dict=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message, **(kwargs or {})))
    except Exception as e:  # jinja errors: the template refused this conversation
        raise APIError(f"The chat template could not render messages: {e}", 400, "messages") from e


class ChatRenderer:
    def __init__(self, tokenizer, sandbox: ChatTemplateSandbox | None,
                 default_template: str | None = None):
        self.tokenizer = tokenizer
        self.sandbox = sandbox  # None: request templates are refused
        self.default_template = default_template  # --chat-template (trusted, as the model's)

    async def render(self, messages, add_generation_prompt: bool = True,
                     continue_final_message: bool = False, kwargs: dict | None = None,
                     chat_template: str | None = None, tools: list[dict] | None = None
                     ) -> list[int]:
        conv = conversation(messages)
        kwargs = dict(kwargs or {})
        template = kwargs.pop("chat_template", None) or chat_template
        if tools is not None:
            kwargs["tools"] = tools
        if template is None:
            if self.default_template is not None:
                kwargs["chat_template"] = self.default_template
            return await asyncio.to_thread(apply_chat_template, self.tokenizer, conv,
                                           add_generation_prompt, continue_final_message, kwargs)
        if self.sandbox is None:
            raise APIError("chat_template: this server does not accept chat templates in requests; "
                           "start it with --trust-request-chat-template to allow them.", 400,
                           "chat_template")
        if not isinstance(template, str):
            raise APIError("chat_template must be a string.", 400, "chat_template")
        tok = self.tokenizer
        context = {name: getattr(tok, name, None) for name in
                   ("bos_token", "eos_token", "pad_token", "unk_token")} | kwargs | {
            "messages": conv, "continue_final_message": continue_final_message,
            "add_generation_prompt": add_generation_prompt and not continue_final_message}
        try:
            text = await self.sandbox.render(template, context)
        except ChatTemplateError as e:
            raise APIError(f"The request's chat template could not render messages: {e}.", 400,
                           "chat_template") from e
        return await asyncio.to_thread(tok.encode, text, add_special_tokens=False)
