"""Reading a request body into its pydantic model, with every way a body can be wrong
answered as a 400 naming what is wrong: not UTF-8, not JSON, NaN or Infinity (not JSON,
though Python's parser takes them), nested past MAX_DEPTH, a string holding a lone UTF-16
surrogate (valid JSON escapes that no tokenizer or response can encode), or fields of the
wrong type."""
from __future__ import annotations

import json

from fastapi import Request
from pydantic import BaseModel, ValidationError

from jaxvllm.entrypoints.openai.errors import APIError, from_validation_error
from jaxvllm.entrypoints.openai.unknown_fields import log_unknown_fields

MAX_DEPTH = 64  # JSON schemas and chat messages nest far less


def _no_constant(name: str):
    raise APIError(f"The request body is not valid JSON: {name} is not a JSON number.")


def _check_structure(obj) -> None:
    """Depth and lone surrogates, without recursion (a deep body must not exhaust the stack)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise APIError(f"The request body holds a string with a lone surrogate "
                                   f"({value[e.start:e.end].encode('utf-8', 'backslashreplace')!r} "
                                   f"at character {e.start}).") from None
            continue
        if isinstance(value, (dict, list)):
            if depth > MAX_DEPTH:
                raise APIError(f"The request body is nested deeper than {MAX_DEPTH} levels.")
            children = value.items() if isinstance(value, dict) else enumerate(value)
            for key, child in children:
                if isinstance(value, dict):
                    stack.append((key, depth))
                if isinstance(child, (str, dict, list)):
                    stack.append((child, depth + 1))


async def parse_body(raw: Request, model: type[BaseModel]):
    media_type = raw.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise APIError(f"The request body must be JSON (Content-Type: application/json), got "
                       f"{media_type[:100]!r}.", 415)
    body = await raw.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"The request body is not valid UTF-8 (invalid byte at offset {e.start}).") from e
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise APIError(f"The request body is not valid JSON: {e.msg} (line {e.lineno}, "
                       f"column {e.colno}).") from e
    except RecursionError:
        raise APIError(f"The request body is nested deeper than {MAX_DEPTH} levels.") from None
    if not isinstance(obj, dict):
        raise APIError(f"The request body must be a JSON object, got {type(obj).__name__}.")
    _check_structure(obj)
    try:
        parsed = model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e, model.field_hints) from e
    log_unknown_fields(model, obj)
    return parsed
