"""Request fields the server does not know are ignored (clients in the wild send many), but
not without a trace: each name is logged once per request type, as vLLM warns. The set of
names logged is bounded, so clients sending random names cannot grow it."""
from __future__ import annotations

import logging

from pydantic import BaseModel

logger = logging.getLogger(__name__)
_MAX_LOGGED = 1000
_logged: set[tuple[str, str]] = set()


def log_unknown_fields(model: type[BaseModel], body: dict) -> None:
    known = set(model.model_fields) | {f.alias for f in model.model_fields.values() if f.alias}
    for name in body.keys() - known:
        key = (model.__name__, name[:64])
        if key in _logged or len(_logged) >= _MAX_LOGGED:
            continue
        _logged.add(key)
        logger.warning("%s: ignoring the unknown field %r (logged once per field name).",
                       model.__name__, key[1])
