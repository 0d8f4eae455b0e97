"""vLLM's legacy `guided_*` request fields (removed from vLLM's API in favour of
`structured_outputs`, still sent by many clients). vLLM now drops them and the reply comes
back unconstrained with a 200: a constraint that "fails open". Here each one is mapped onto
`structured_outputs` with a warning once per field name, and whatever cannot be mapped is
refused (400 naming the field), so a constraint is never silently lost."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from jaxvllm.vllm_compat import warn_legacy_once

# legacy field -> StructuredOutputsParams field
CONSTRAINTS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
               "guided_grammar": "grammar"}


class LegacyGuidedFields(BaseModel):
    """A base of the completions and chat request models."""
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None

    def legacy_structured_outputs(self) -> dict[str, Any] | None:
        """The structured_outputs the legacy fields ask for (None when they ask for none);
        ValueError, naming the field, for what cannot be honoured."""
        given = {name: getattr(self, name) for name in CONSTRAINTS if getattr(self, name) is not None}
        if self.guided_decoding_backend is not None:
            warn_legacy_once("guided_decoding_backend", "the server's one backend (llguidance)")
        if self.guided_whitespace_pattern is not None:
            raise ValueError("guided_whitespace_pattern is not supported: JSON grammars allow up to "
                             "20 whitespace characters between tokens.")
        if not given:
            return None
        if len(given) > 1:
            raise ValueError(f"{next(iter(given))} cannot be combined with {', '.join(list(given)[1:])}: "
                             f"set exactly one constraint.")
        name, value = next(iter(given.items()))
        if getattr(self, "structured_outputs", None) is not None:
            raise ValueError(f"{name} cannot be combined with structured_outputs (its replacement).")
        fmt = getattr(self, "response_format", None)
        if fmt is not None and fmt.type != "text":
            raise ValueError(f"{name} cannot be combined with response_format.")
        warn_legacy_once(name, f"structured_outputs.{CONSTRAINTS[name]}")
        return {CONSTRAINTS[name]: value}
