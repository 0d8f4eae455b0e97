"""OpenAI-shaped error bodies: {"error": {"message", "type", "param", "code"}}.

Every failure a client can cause becomes one of these with the offending field in
`param`, so SDKs show a useful message instead of a stack trace.
"""
from __future__ import annotations

import os.path
import re
from http import HTTPStatus

from fastapi.responses import JSONResponse
from pydantic import ValidationError

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          413: "RequestEntityTooLargeError", 500: "InternalServerError",
          503: "ServiceUnavailableError"}


class APIError(Exception):
    """Raised anywhere in a handler; the app's exception handler renders it."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    err_type = _TYPES.get(status) or HTTPStatus(status).phrase.replace(" ", "")
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(message: str, status: int = 400, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param), status_code=status, headers=headers)


def _is_union_tag(part) -> bool:
    """pydantic puts the tried member type ('list[int]', 'str', 'StreamOptions') into the
    location of union errors; it is not part of the client's field path."""
    return isinstance(part, str) and ("[" in part or part[:1].isupper()
                                      or part in ("str", "int", "float", "bool", "none"))


def _fmt_path(path: list) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def from_validation_error(exc: ValidationError, hints: dict[str, str] | None = None) -> APIError:
    """The first invalid field; errors of one union field are merged into one message, or
    replaced by `hints[path]` (list indices written as [])."""
    errors = exc.errors(include_url=False)
    paths = [[p for p in e["loc"] if not _is_union_tag(p)] for e in errors]
    top = paths[0][:1]
    same = [(e, p) for e, p in zip(errors, paths) if p[:1] == top]
    common = os.path.commonprefix([p for _, p in same])
    param = _fmt_path(common) or None
    reasons = list(dict.fromkeys(
        (f"{_fmt_path(p[len(common):]).lstrip('.')}: " if len(p) > len(common) else "") + e["msg"]
        for e, p in same))
    hint = (hints or {}).get(re.sub(r"\[\d+\]", "[]", param or ""))
    if hint and len(reasons) > 1:  # a value no member of the union accepts
        return APIError(f"Invalid request field '{param}': {hint}", 400, param)
    more = f" (and {len(reasons) - 4} more)" if len(reasons) > 4 else ""
    return APIError(f"Invalid request field '{param}': {' or '.join(reasons[:4])}{more}.",
                    400, param)


def param_of_value_error(message: str, renames: dict[str, str] | None = None) -> str | None:
    """SamplingParams/Processor messages start with the field they reject."""
    first = message.split(" ", 1)[0].strip(":,.'")
    known = {"n", "temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "min_tokens",
             "stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "logprobs", "prompt_logprobs", "logit_bias", "prompt",
             "prompt_token_ids", "priority", "structured_outputs", "response_format",
             "beam_width", "length_penalty", "allowed_token_ids", "bad_words", "guided_json",
             "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern",
             "dimensions", "truncate_prompt_tokens", "pooling_type", "normalize", "use_activation"}
    if first in known:
        return (renames or {}).get(first, first)
    if first.split(".")[0] in known:  # a nested field such as response_format.json_schema
        return first
    if "prompt" in message.lower():
        return "prompt"
    return None
