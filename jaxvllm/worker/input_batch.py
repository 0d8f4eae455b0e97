"""The worker's own record of each request it runs, kept across steps.

The scheduler sends full data once per request and diffs afterwards; this is where
those diffs land, and where the worker appends the tokens it samples itself. Each
request also holds a row slot in [0, max_num_seqs) for as long as the worker knows it:
its row of the sampler's persistent device arrays (worker/penalties.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.outputs import LogprobsLists
from jaxvllm.sampling_params import SamplingParams


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]  # prompt followed by every token generated so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    sampling_seed: int
    eos_token_id: int | None
    block_ids: list[int]
    num_computed_tokens: int
    slot: int
    # Fixed for the request's life, so the step loop reads flags instead of params.
    has_row: bool = False   # its persistent penalty/bias row is written and used
    extended: bool = False  # needs the sampler's extended variant (row, logprobs, grammar)
    # Prompt logprobs gathered chunk by chunk until the first token is sampled, then sent.
    prompt_logprobs: LogprobsLists | None = None

    def __post_init__(self) -> None:
        p = self.sampling_params
        self.has_row = p.uses_penalty_row
        self.extended = p.uses_extended_sampler
        if p.prompt_logprobs is not None and self.num_output_tokens == 0:
            self.prompt_logprobs = LogprobsLists([], [], [])

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def ids_to_suppress(self) -> list[int]:
        """Tokens that must not be sampled next: stop tokens while min_tokens is not
        reached, and the last token of each multi-token bad word whose other tokens
        end the output so far (vLLM's bad-words rule; one-token words sit in the bias row)."""
        p = self.sampling_params
        ids = []
        if self.num_output_tokens < p.min_tokens:
            ids.extend(p.stop_token_ids)
            if not p.ignore_eos and self.eos_token_id is not None:
                ids.append(self.eos_token_id)
        if p.bad_words_token_ids:
            output = self.token_ids[self.num_prompt_tokens:]
            for word in p.bad_words_token_ids:
                n = len(word) - 1
                if 0 < n <= len(output) and output[-n:] == word[:-1]:
                    ids.append(word[-1])
        return ids


class InputBatch:
    def __init__(self, max_num_seqs: int):
        self.requests: dict[str, CachedRequestState] = {}
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))

    def update_states(self, out: SchedulerOutput) -> list[CachedRequestState]:
        """Applies the step's changes; returns the states added (their rows need writing)."""
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            state = self.requests.pop(req_id, None)
            if state is not None:
                self._free_slots.append(state.slot)
        added = []
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = state = CachedRequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                sampling_seed=new.sampling_seed,
                eos_token_id=new.eos_token_id,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                slot=self._free_slots.pop(),
            )
            added.append(state)
        cached = out.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                                cached.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = computed
        return added
