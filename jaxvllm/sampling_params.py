"""SamplingParams: how one request is decoded, with vLLM's field names and defaults.

Validation happens here, at construction, so every bad value is reported with the
field's name and its allowed range before the request reaches the engine.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

# Most top logprobs a request may ask for (vLLM's default max_logprobs); the sampler
# always computes this many, so one compiled variant serves every k.
MAX_LOGPROBS = 20


@dataclass
class StructuredOutputsParams:
    """Constrains the output to a grammar (vLLM's name and fields): set exactly one of
    json (a JSON schema, as dict or string), regex, choice (one of these strings),
    grammar (Lark) or json_object (any JSON object)."""
    json: str | dict | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [k for k in ("json", "regex", "choice", "grammar", "json_object") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs must set exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}.")
        if self.choice is not None and any(not isinstance(c, str) or not c for c in self.choice):
            raise ValueError(f"structured_outputs.choice must be non-empty strings, got {self.choice!r}.")


class RequestOutputKind(enum.IntEnum):
    """What each RequestOutput of a streaming request holds (vLLM's names)."""
    CUMULATIVE = 0  # everything generated so far
    DELTA = 1       # only what is new since the previous output
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class SamplingParams:
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # Filled in by the Processor from `bad_words` (vLLM's name): each word's token ids.
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:  # JSON keys arrive as strings; vLLM clamps to +-100
            try:
                self.logit_bias = {int(t): min(100.0, max(-100.0, float(b)))
                                   for t, b in self.logit_bias.items()}
            except (TypeError, ValueError, AttributeError):
                raise ValueError(f"logit_bias must map token ids to floats, got {self.logit_bias!r}.")
        self._verify()

    def _verify(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"{name} must be {allowed}, got {getattr(self, name)!r}.")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad("n", "at least 1")
        if not self.temperature >= 0.0:
            raise bad("temperature", "non-negative")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise bad("top_k", "-1, 0 (disable) or a positive integer")
        if not 0.0 <= self.min_p <= 1.0:
            raise bad("min_p", "in [0, 1]")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):
            raise bad("seed", "an integer in [0, 2**63)")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad("max_tokens", "at least 1")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad("min_tokens", "non-negative")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise bad("stop_token_ids", "a list of non-negative token ids")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise bad("stop", "a list of non-empty strings")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "in [-2, 2]")
        if not self.repetition_penalty > 0.0:
            raise bad("repetition_penalty", "greater than 0")
        if self.logit_bias is not None and any(t < 0 for t in self.logit_bias):
            raise bad("logit_bias", "keyed by non-negative token ids")
        if self.allowed_token_ids is not None and (
                not self.allowed_token_ids
                or any(not isinstance(t, int) or t < 0 for t in self.allowed_token_ids)):
            raise bad("allowed_token_ids", "a non-empty list of non-negative token ids")
        if self.bad_words is not None and any(not isinstance(w, str) or not w.strip()
                                              for w in self.bad_words):
            raise bad("bad_words", "a list of non-empty strings")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or not 0 <= k <= MAX_LOGPROBS):
                raise bad(name, f"None or an integer in [0, {MAX_LOGPROBS}]")

    @property
    def bad_words_token_ids(self) -> list[list[int]]:
        return self._bad_words_token_ids or []

    @property
    def uses_penalty_row(self) -> bool:
        """Whether the sampler needs this request's persistent device row: its token
        counts (penalties) or its constant bias (logit_bias, allowed ids, one-token bad words)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.allowed_token_ids is not None
                    or any(len(w) == 1 for w in self.bad_words_token_ids))

    @property
    def uses_extended_sampler(self) -> bool:
        """Whether a batch holding this request runs the sampler's extended variant."""
        return self.uses_penalty_row or self.logprobs is not None or self.structured_outputs is not None

    @property
    def sampling_type_greedy(self) -> bool:
        """Greedy decoding: temperature 0 (vLLM treats tiny temperatures the same way)."""
        return self.temperature < 1e-5


@dataclass
class BeamSearchParams:
    """For `LLM.beam_search` (jaxvllm/beam_search.py), with vLLM's fields."""
    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.beam_width, int) or not 1 <= self.beam_width <= MAX_LOGPROBS // 2:
            raise ValueError(f"beam_width must be an integer in [1, {MAX_LOGPROBS // 2}], "
                             f"got {self.beam_width!r}.")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens!r}.")
