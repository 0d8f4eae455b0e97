"""The persistent input batch (vLLM's `InputBatch`): one row of numpy arrays per request the
worker holds, kept across steps.

The scheduler sends full data once per request and diffs afterwards; `update_states` lands
them in the rows, and the runner appends the tokens it samples. A request keeps its row (its
slot in [0, max_num_seqs), also its row of the sampler's device arrays, worker/penalties.py)
from arrival to finish or preemption, so rows never move and need no condensing: a step's
inputs are gathers over the scheduled rows (worker/step_inputs.py), whatever their order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.outputs import LogprobsLists
from jaxvllm.sampling_params import SamplingParams


@dataclass(eq=False)
class CachedRequestState:
    """What only some requests need, read where their rare paths run; the hot per-step
    values (tokens, progress, blocks, sampling parameters) are the batch's rows."""
    req_id: str
    num_prompt_tokens: int
    sampling_params: SamplingParams  # a pooling request's: neutral (its rows are never read)
    eos_token_id: int | None
    slot: int
    # Fixed for the request's life, so the step loop reads flags instead of params.
    has_row: bool = False   # its persistent penalty/bias row is written and used
    extended: bool = False  # needs the sampler's extended variant (row, logprobs, grammar)
    # Prompt logprobs gathered chunk by chunk until the first token is sampled, then sent.
    prompt_logprobs: LogprobsLists | None = None
    live: bool = True  # False once dropped: a late (async) result must not touch its slot


def suppressed_ids(params: SamplingParams, eos_token_id: int | None, num_output_tokens: int,
                   output_tail: list[int]) -> list[int]:
    """Tokens that must not be sampled next: stop tokens while min_tokens is not reached,
    and the last token of each multi-token bad word whose other tokens end the output so far
    (vLLM's bad-words rule; one-token words sit in the bias row). output_tail: the output's
    last tokens, at least as many as the longest bad word less one (or all of them)."""
    ids = []
    if num_output_tokens < params.min_tokens:
        ids.extend(params.stop_token_ids)
        if not params.ignore_eos and eos_token_id is not None:
            ids.append(eos_token_id)
    for word in params.bad_words_token_ids:
        n = len(word) - 1
        if 0 < n <= len(output_tail) and output_tail[-n:] == word[:-1]:
            ids.append(word[-1])
    return ids


_NEUTRAL = SamplingParams(temperature=0.0)  # the sampling rows of a pooling request, never read


class InputBatch:
    def __init__(self, max_num_seqs: int, max_model_len: int, max_pages_per_seq: int, num_kv_cache_groups: int = 1):
        S = max_num_seqs
        self.requests: dict[str, CachedRequestState] = {}
        self.slot_of: dict[str, int] = {}  # requests[r].slot, for gathers by map (no Python loop)
        self.states: list[CachedRequestState | None] = [None] * S  # by row
        self.owing_prompt_logprobs: set[CachedRequestState] = set()  # until their first token
        self._free_slots = list(range(S - 1, -1, -1))
        self.token_ids = np.zeros((S, max_model_len), np.int32)
        # Prompt plus sampled tokens, counting one still in flight (async scheduling), whose
        # value is not on the host yet: the next step reads it on device instead.
        self.num_tokens = np.zeros(S, np.int32)
        self.num_host_tokens = np.zeros(S, np.int32)  # tokens whose value token_ids holds
        self.num_prompt_tokens = np.zeros(S, np.int32)
        self.num_computed_tokens = np.zeros(S, np.int32)
        # One block table per KV cache group (vLLM's MultiGroupBlockTable); entries a sliding
        # window has passed keep their old id, which the kernels' window never reads.
        self.block_table = np.zeros((num_kv_cache_groups, S, max_pages_per_seq), np.int32)
        self.num_blocks = np.zeros((num_kv_cache_groups, S), np.int32)
        # Sampling parameters (sampling_inputs.py gathers them per step).
        self.temperature = np.zeros(S, np.float32)
        self.top_k = np.zeros(S, np.int32)
        self.top_p = np.ones(S, np.float32)
        self.min_p = np.zeros(S, np.float32)
        self.seed = np.zeros((S, 2), np.uint32)
        self.suppresses = np.zeros(S, bool)  # min_tokens or multi-token bad words
        self.has_row = np.zeros(S, bool)
        self.extended = np.zeros(S, bool)
        self.presence = np.zeros(S, np.float32)
        self.frequency = np.zeros(S, np.float32)
        self.repetition = np.ones(S, np.float32)
        self.num_logprobs = np.full(S, -1, np.int32)  # k of SamplingParams.logprobs, -1: none
        self.generation = np.zeros(S, np.int64)  # bumped when a row gets a new request
        self.lora_int_id = np.zeros(S, np.int32)  # the row's LoRA adapter (0: none)

    def update_states(self, out: SchedulerOutput) -> list[CachedRequestState]:
        """Applies the step's changes; returns the states added (their rows need writing)."""
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            state = self.requests.pop(req_id, None)
            if state is not None:
                del self.slot_of[req_id]
                state.live = False
                self.states[state.slot] = None
                self.owing_prompt_logprobs.discard(state)
                self._free_slots.append(state.slot)
        added = [self._add(new) for new in out.scheduled_new_reqs]
        cached = out.scheduled_cached_reqs
        if cached.req_ids:
            slots = list(map(self.slot_of.__getitem__, cached.req_ids))
            self.num_computed_tokens[slots] = cached.num_computed_tokens
            for slot, new_block_ids in zip(slots, cached.new_block_ids):
                for g, new_blocks in enumerate(new_block_ids):
                    if new_blocks:  # most decode steps add none
                        n = self.num_blocks[g, slot]
                        self.block_table[g, slot, n:n + len(new_blocks)] = new_blocks
                        self.num_blocks[g, slot] = n + len(new_blocks)
        return added

    def _add(self, new) -> CachedRequestState:
        p = new.sampling_params or _NEUTRAL
        slot = self._free_slots.pop()
        state = CachedRequestState(req_id=new.req_id, num_prompt_tokens=len(new.prompt_token_ids),
                                   sampling_params=p, eos_token_id=new.eos_token_id, slot=slot,
                                   has_row=p.uses_penalty_row, extended=p.uses_extended_sampler)
        if p.prompt_logprobs is not None and not new.output_token_ids:
            state.prompt_logprobs = LogprobsLists([], [], [])
            self.owing_prompt_logprobs.add(state)
        self.requests[new.req_id] = self.states[slot] = state
        self.slot_of[new.req_id] = slot
        num_prompt, num_out = len(new.prompt_token_ids), len(new.output_token_ids)
        n = num_prompt + num_out
        self.token_ids[slot, :num_prompt] = new.prompt_token_ids
        self.token_ids[slot, num_prompt:n] = new.output_token_ids
        self.num_tokens[slot] = self.num_host_tokens[slot] = n
        self.num_prompt_tokens[slot] = num_prompt
        self.num_computed_tokens[slot] = new.num_computed_tokens
        for g, block_ids in enumerate(new.block_ids):
            self.block_table[g, slot, :len(block_ids)] = block_ids
            self.num_blocks[g, slot] = len(block_ids)
        self.temperature[slot] = 0.0 if p.sampling_type_greedy else p.temperature
        self.top_k[slot], self.top_p[slot], self.min_p[slot] = p.top_k, p.top_p, p.min_p
        self.seed[slot] = (new.sampling_seed >> 32, new.sampling_seed & 0xFFFFFFFF)
        self.suppresses[slot] = p.min_tokens > 0 or any(len(w) > 1 for w in p.bad_words_token_ids)
        self.has_row[slot], self.extended[slot] = state.has_row, state.extended
        self.presence[slot], self.frequency[slot] = p.presence_penalty, p.frequency_penalty
        self.repetition[slot] = p.repetition_penalty
        self.num_logprobs[slot] = -1 if p.logprobs is None else p.logprobs
        self.generation[slot] += 1
        self.lora_int_id[slot] = new.lora_request.lora_int_id if new.lora_request is not None else 0
        return state

    def token_list(self, state: CachedRequestState, start: int = 0, end: int | None = None) -> list[int]:
        """The request's token ids on the host (prompt, then output), start:end."""
        slot = state.slot
        end = self.num_host_tokens[slot] if end is None else end
        return self.token_ids[slot, start:end].tolist()

    def suppressed_ids(self, state: CachedRequestState) -> list[int]:
        p, slot = state.sampling_params, state.slot
        longest = max((len(w) for w in p.bad_words_token_ids), default=1)
        num_host = int(self.num_host_tokens[slot])
        tail_start = max(state.num_prompt_tokens, num_host - longest + 1)
        return suppressed_ids(p, state.eos_token_id, int(self.num_tokens[slot]) - state.num_prompt_tokens,
                              self.token_list(state, tail_start, num_host))
