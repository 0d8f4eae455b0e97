"""A config section given as vLLM's users give it: the section itself, a dict of its fields,
or their JSON (a `--pooler-config` / `--speculative-config` on the command line)."""
from __future__ import annotations

import dataclasses
import json


def section_fields(value, cls, name: str) -> dict | None:
    """The dict of `cls`'s fields that `value` names (None for None, value itself if it is
    already a `cls`), refusing bad JSON, a non-dict and unknown fields, naming `name`."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"{name} must be JSON, got {value!r} ({e.msg}).") from None
    known = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a dict of {known}, got {type(value).__name__}.")
    if unknown := sorted(set(value) - set(known)):
        raise ValueError(f"{name} has unknown fields {unknown}; known: {sorted(known)}.")
    return value
