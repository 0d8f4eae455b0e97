"""The scheduler's side of speculative decoding: what a verify step's result does to a
request, and the acceptance counters (vLLM's SpecDecodingStats and metric names).

A request scheduled with d drafts computed 1 + d tokens; the worker returns its accepted
drafts and one token after them (1 to d + 1 tokens). The rejected drafts' positions are
uncomputed again (their KV slots stay with the request and are overwritten by its next
tokens; every page returns to the pool when it finishes). The tokens are appended one at a
time with the stop rules checked after each, so a stop token, EOS or max_tokens inside an
accepted run ends the request there and nothing after it is emitted.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from jaxvllm.core.request import Request
from jaxvllm.core.sched_utils import check_stop


@dataclass
class SpecDecodingStats:
    """Cumulative counts since start (vLLM's vllm:spec_decode_* counters)."""
    num_drafts: int = 0          # requests verified with at least one draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        per_pos = self.num_accepted_tokens_per_pos
        for i in range(num_accepted):
            per_pos[i] += 1


def accept_tokens(request: Request, sampled: list[int], num_draft: int, next_drafts: list[int],
                  max_model_len: int, stats: SpecDecodingStats) -> list[int]:
    """Apply one verify step's tokens to the request: roll back the rejected drafts' positions,
    append the tokens up to the first that stops it, and keep the proposer's next drafts
    (no more than its max_tokens leaves room for). Returns the tokens appended."""
    if num_draft:
        request.num_computed_tokens -= num_draft + 1 - len(sampled)
        stats.observe(num_draft, len(sampled) - 1)
    output = request.output_token_ids
    for n, token in enumerate(sampled, 1):
        output.append(token)
        if n < len(sampled) and check_stop(request, max_model_len):
            sampled = sampled[:n]
            break
    max_tokens = request.sampling_params.max_tokens
    room = len(next_drafts) if max_tokens is None else max_tokens - len(output) - 1
    request.spec_token_ids = next_drafts[:max(0, room)]
    return sampled
