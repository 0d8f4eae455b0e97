"""The worker's own record of each request it runs, kept across steps.

The scheduler sends full data once per request and diffs afterwards; this is where
those diffs land, and where the worker appends the tokens it samples itself.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.core.sched_output import SchedulerOutput
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

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    def stop_ids_to_suppress(self) -> list[int]:
        """Tokens that must not be sampled yet because min_tokens is not reached."""
        p = self.sampling_params
        if self.num_output_tokens >= p.min_tokens:
            return []
        ids = list(p.stop_token_ids)
        if not p.ignore_eos and self.eos_token_id is not None:
            ids.append(self.eos_token_id)
        return ids


class InputBatch:
    def __init__(self):
        self.requests: dict[str, CachedRequestState] = {}

    def update_states(self, out: SchedulerOutput) -> None:
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.requests.pop(req_id, None)
        for new in out.scheduled_new_reqs:
            self.requests[new.req_id] = CachedRequestState(
                req_id=new.req_id,
                token_ids=list(new.prompt_token_ids) + list(new.output_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=new.sampling_params,
                sampling_seed=new.sampling_seed,
                eos_token_id=new.eos_token_id,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
            )
        cached = out.scheduled_cached_reqs
        for req_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids,
                                                cached.num_computed_tokens):
            state = self.requests[req_id]
            state.block_ids.extend(new_blocks)
            state.num_computed_tokens = computed
