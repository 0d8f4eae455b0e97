"""Structured output: each constrained request's grammar matcher, on the host (llguidance).

As in vLLM V1, the scheduler owns the matchers: when it schedules a step it asks each
constrained request that will sample for its allowed-token bitmask (one bit per token,
int32 words, token t at bit t % 32 of word t // 32), the worker masks the logits with it
on device, and the sampled token is fed back to the matcher. llguidance only allows EOS
once the grammar is complete, so requests end through the normal EOS stop; a matcher that
fails midway (its lexer gives up) allows only EOS too, so that token is refused here and
the request ends with an error instead of a "stop" on text that breaks its grammar.

Each request's mask work is bounded (core/grammar_limits.py): llguidance's limits per step,
and a budget of CPU time (this thread's, so another process on the core costs it nothing)
charged for its masks and token feeds. A request past its budget gets a mask of EOS alone,
and its next token ends it with the error.
"""
from __future__ import annotations

import json
import re
import time

import numpy as np

from jaxvllm.core.grammar_limits import MASK_BUDGET_S, MASK_LIMITS, MASK_REFILL_S, check_grammar_limits
from jaxvllm.core.json_schema import with_vllm_defaults
from jaxvllm.core.request import Request
from jaxvllm.sampling_params import StructuredOutputsParams

_LIMIT_ERROR = re.compile(r"too many|fuel", re.IGNORECASE)


def grammar_for(params: StructuredOutputsParams) -> str:
    """The llguidance grammar for the params; ValueError if it does not compile."""
    import llguidance

    for kind in ("json", "regex", "choice", "grammar"):
        if getattr(params, kind) is not None:
            check_grammar_limits(f"structured_outputs.{kind}", kind, getattr(params, kind))
    M = llguidance.LLMatcher
    if params.json is not None or params.json_object:
        schema = with_vllm_defaults(params.json if params.json is not None else {"type": "object"})
        grammar = M.grammar_from_json_schema(schema if isinstance(schema, str) else json.dumps(schema))
    elif params.regex is not None:
        grammar = M.grammar_from_regex(params.regex)
    elif params.choice is not None:
        grammar = M.grammar_from_regex("|".join(_escape(c) for c in params.choice))
    else:
        grammar = M.grammar_from_lark(params.grammar)
    error = M.validate_grammar(grammar)
    if error:
        raise ValueError(f"structured_outputs does not compile: {error}")
    return grammar


def _escape(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?()[]{}|\/-" else c for c in text)


class StructuredOutputManager:
    def __init__(self, load_tokenizer, vocab_size: int):
        self._load_tokenizer = load_tokenizer  # loaded on the first constrained request (~1 s)
        self._ll_tokenizer = None
        self.vocab_size = vocab_size
        self.num_words = -(-vocab_size // 32)
        self.matchers: dict[str, object] = {}
        self.budget_s: dict[str, float] = {}  # CPU seconds of mask work each request has left
        self.over_budget: dict[str, str] = {}  # request -> why it ends

    def add_request(self, request: Request) -> None:
        import llguidance
        import llguidance.hf

        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance.hf.from_tokenizer(self._load_tokenizer())
        grammar = grammar_for(request.sampling_params.structured_outputs)
        matcher = llguidance.LLMatcher(self._ll_tokenizer, grammar, log_level=0,
                                       limits=llguidance.LLParserLimits(**MASK_LIMITS))
        if matcher.is_error():
            raise ValueError(f"structured_outputs does not compile: {matcher.get_error()}")
        # Tokens generated before (a resumed request) already constrain what follows.
        matcher.consume_tokens(request.output_token_ids)
        self.matchers[request.request_id] = matcher
        self.budget_s[request.request_id] = MASK_BUDGET_S + MASK_REFILL_S * len(request.output_token_ids)

    def remove_request(self, request_id: str) -> None:
        self.matchers.pop(request_id, None)
        self.budget_s.pop(request_id, None)
        self.over_budget.pop(request_id, None)

    def _charge(self, request_id: str, started: float) -> None:
        self.budget_s[request_id] -= time.thread_time() - started
        if self.budget_s[request_id] < 0 and request_id not in self.over_budget:
            self.over_budget[request_id] = (
                f"structured_outputs: computing the grammar's token masks took more than its budget "
                f"({MASK_BUDGET_S:g} s of CPU time plus {MASK_REFILL_S * 1000:g} ms per token); "
                f"simplify the grammar.")

    def grammar_bitmask(self, request_ids, drafts: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
        """Allowed-token words per request, cut (or zero-padded) to the model's vocab. With
        speculative decoding's drafts (valid ones: validate_drafts), one row per position the
        verify step samples, after 0..d of the request's d drafts, concatenated."""
        import llguidance.numpy as lln

        if not request_ids:
            return {}
        drafts = drafts or {}
        counts = [len(drafts.get(req_id, ())) + 1 for req_id in request_ids]
        words = lln.allocate_token_bitmask(sum(counts), self._ll_tokenizer.vocab_size)
        i = 0
        for req_id in request_ids:
            matcher, ahead = self.matchers[req_id], drafts.get(req_id, [])
            if req_id in self.over_budget:  # EOS alone, which accept_token turns into the error
                words[i:i + len(ahead) + 1] = self._eos_only()
                i += len(ahead) + 1
                continue
            started = time.thread_time()
            for j in range(len(ahead) + 1):
                lln.fill_next_token_bitmask(matcher, words, i)
                i += 1
                if j < len(ahead):
                    matcher.consume_token(ahead[j])
            if ahead:
                matcher.rollback(len(ahead))
            self._charge(req_id, started)
        rows = np.zeros((len(words), self.num_words), np.int32)
        n = min(self.num_words, words.shape[1])
        rows[:, :n] = words[:, :n]
        ends = np.cumsum(counts)
        return {req_id: rows[end - c:end].ravel().tolist() for req_id, c, end in zip(request_ids, counts, ends)}

    def _eos_only(self) -> np.ndarray:
        eos, row = self._ll_tokenizer.eos_token, np.zeros(-(-self._ll_tokenizer.vocab_size // 32), np.uint32)
        row[eos // 32] = 1 << eos % 32
        return row.view(np.int32)

    def validate_drafts(self, request_id: str, drafts: list[int]) -> list[int]:
        """The drafts up to the first the grammar does not allow there."""
        return drafts[:self.matchers[request_id].validate_tokens(drafts)]

    def accept_token(self, request_id: str, token: int) -> str | None:
        """Feeds the sampled token to the matcher; returns why the grammar failed, if it did."""
        if request_id in self.over_budget:
            return self.over_budget[request_id]
        matcher, started = self.matchers[request_id], time.thread_time()
        if not matcher.is_error():
            matcher.consume_token(token)
        self._charge(request_id, started)
        self.budget_s[request_id] += MASK_REFILL_S
        if matcher.is_error():
            reason = matcher.get_error().splitlines()[0][:200]
            if _LIMIT_ERROR.search(reason):  # llguidance's per-step limits (MASK_LIMITS)
                return (f"structured_outputs: computing the grammar's next-token mask went past its "
                        f"per-step limit ({reason}); simplify the grammar.")
            return f"structured_outputs: the grammar could not be followed ({reason})."
        return None
