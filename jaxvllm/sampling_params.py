"""SamplingParams: how one request is decoded, with vLLM's field names and defaults.

Validation happens here, at construction, so every bad value is reported with the
field's name and its allowed range before the request reaches the engine.
"""
from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, field

from jaxvllm.vllm_compat import SAMPLING_REFUSED, STRUCTURED_REFUSED, refuse, warn_legacy_once

# Most top logprobs a request may ask for (vLLM's default max_logprobs); the sampler
# always computes this many, so one compiled variant serves every k.
MAX_LOGPROBS = 20
# Counts and token ids travel to the device as int32 (seeds as two uint32 halves).
INT32_MAX = 2**31 - 1


def is_int(x) -> bool:
    """An integer that is not a bool (JSON true is no token id or count)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_token_ids(ids) -> bool:
    return isinstance(ids, list) and all(is_int(t) and 0 <= t <= INT32_MAX for t in ids)


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
        types: dict[str, type | tuple[type, ...]] = {"json": (str, dict), "regex": str, "choice": list,
                                                     "grammar": str, "json_object": bool}
        for name, allowed in types.items():
            value = getattr(self, name)
            if value is not None and not isinstance(value, allowed):
                kind = " or ".join(t.__name__ for t in (allowed if isinstance(allowed, tuple) else (allowed,)))
                raise ValueError(f"structured_outputs.{name} must be a {kind}, got {type(value).__name__}.")
        if self.choice is not None and (not self.choice or any(not isinstance(c, str) or not c
                                                               for c in self.choice)):
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
    # vLLM's extra arguments; the one read here is `kv_transfer_params` (a KV connector's
    # per-request orders: kv_transfer/jax_transfer_connector.py).
    extra_args: dict | None = None
    # Filled in by the Processor from `bad_words` (vLLM's name): each word's token ids.
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:  # JSON keys arrive as strings; vLLM clamps to +-100
            self.logit_bias = _parse_logit_bias(self.logit_bias)
        self._verify()

    def _verify(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            value = repr(getattr(self, name))
            return ValueError(f"{name} must be {allowed}, got {value[:100]}{'...' if len(value) > 100 else ''}.")

        def int_in(name: str, low: int, high: int = INT32_MAX) -> bool:
            value = getattr(self, name)
            return is_int(value) and low <= value <= high

        if not int_in("n", 1):
            raise bad("n", f"an integer in [1, {INT32_MAX}]")
        if not (is_real(self.temperature) and self.temperature >= 0.0):
            raise bad("temperature", "a finite non-negative number")
        if not (is_real(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise bad("top_p", "in (0, 1]")
        if not int_in("top_k", -1):
            raise bad("top_k", f"-1, 0 (disable) or a positive integer up to {INT32_MAX}")
        if not (is_real(self.min_p) and 0.0 <= self.min_p <= 1.0):
            raise bad("min_p", "in [0, 1]")
        if self.seed is not None and not int_in("seed", 0, 2**63 - 1):
            raise bad("seed", "an integer in [0, 2**63)")
        if self.max_tokens is not None and not int_in("max_tokens", 1):
            raise bad("max_tokens", f"an integer in [1, {INT32_MAX}]")
        if not int_in("min_tokens", 0):
            raise bad("min_tokens", f"an integer in [0, {INT32_MAX}]")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens must be less than or equal to max_tokens={self.max_tokens}, "
                f"got {self.min_tokens}.")
        if not is_token_ids(self.stop_token_ids):
            raise bad("stop_token_ids", "a list of token ids")
        if any(not isinstance(s, str) or not s for s in self.stop or ()):
            raise bad("stop", "a list of non-empty strings")
        for name in ("presence_penalty", "frequency_penalty"):
            if not (is_real(getattr(self, name)) and -2.0 <= getattr(self, name) <= 2.0):
                raise bad(name, "in [-2, 2]")
        if not (is_real(self.repetition_penalty) and self.repetition_penalty > 0.0):
            raise bad("repetition_penalty", "a finite number greater than 0")
        if self.allowed_token_ids is not None and not (self.allowed_token_ids
                                                       and is_token_ids(self.allowed_token_ids)):
            raise bad("allowed_token_ids", "a non-empty list of token ids")
        if self.bad_words is not None and (not isinstance(self.bad_words, list) or any(
                not isinstance(w, str) or not w.strip() for w in self.bad_words)):
            raise bad("bad_words", "a list of non-empty strings")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and not int_in(name, 0, MAX_LOGPROBS):
                raise bad(name, f"None or an integer in [0, {MAX_LOGPROBS}]")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens",
                     "spaces_between_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "true or false")
        if self.extra_args is not None and not (isinstance(self.extra_args, dict)
                                                and set(self.extra_args) <= {"kv_transfer_params"}
                                                and isinstance(self.extra_args.get("kv_transfer_params", {}), dict)):
            raise bad("extra_args", "a dict whose one key is kv_transfer_params (a dict): no sampler here "
                      "reads other extra args")

    @property
    def kv_transfer_params(self) -> dict | None:
        return (self.extra_args or {}).get("kv_transfer_params")

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


def _accept_vllm_keywords(cls, table: dict, where: str, legacy=None):
    """cls(...) also takes vLLM's keywords of `table`: a neutral value is dropped, another
    refused (ValueError naming it); `legacy` maps deprecated names onto current ones."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        if legacy is not None:
            legacy(kwargs)
        init(self, *args, **refuse(kwargs, table, where))

    cls.__init__ = __init__


def _map_guided_decoding(kwargs: dict) -> None:
    """vLLM <= 0.10's `guided_decoding` is today's `structured_outputs`: mapped, never dropped."""
    guided = kwargs.pop("guided_decoding", None)
    if guided is None:
        return
    warn_legacy_once("guided_decoding", "structured_outputs")
    if kwargs.get("structured_outputs") is not None:
        raise ValueError("guided_decoding and structured_outputs cannot both be set; "
                         "use structured_outputs.")
    if isinstance(guided, dict):
        guided = {k: v for k, v in guided.items() if k != "backend"}  # one backend here
        guided = StructuredOutputsParams(**guided)
    if not isinstance(guided, StructuredOutputsParams):
        raise ValueError(f"guided_decoding must be a StructuredOutputsParams or a dict, "
                         f"got {type(guided).__name__}.")
    kwargs["structured_outputs"] = guided


_accept_vllm_keywords(SamplingParams, SAMPLING_REFUSED, "SamplingParams", _map_guided_decoding)
_accept_vllm_keywords(StructuredOutputsParams, STRUCTURED_REFUSED, "StructuredOutputsParams")


def _parse_logit_bias(bias) -> dict[int, float]:
    """{token id: bias} from ints or digit strings to finite numbers, clamped to [-100, 100]."""
    def token(t):
        return int(t) if isinstance(t, str) and t.lstrip("-").isdigit() else t

    if isinstance(bias, dict):
        out = {token(t): v for t, v in bias.items()}
        if all(is_int(t) and 0 <= t <= INT32_MAX and is_real(v) for t, v in out.items()):
            return {t: min(100.0, max(-100.0, float(v))) for t, v in out.items()}
    shown = repr(bias)
    raise ValueError(f"logit_bias must map token ids to finite numbers, got "
                     f"{shown[:100]}{'...' if len(shown) > 100 else ''}.")


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
