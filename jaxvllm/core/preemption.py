"""Preemption: when the pool has no page left for a running request, which request gives
way (pick_victim) and what it keeps (preempt): with preemption_mode="swap" its pages are
copied to host slots and it resumes where it was; otherwise, or when the host slots run
short, its pages are freed and it is recomputed from its prompt."""
from __future__ import annotations

from jaxvllm.core.kv_cache_manager import KVCacheManager
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.sched_utils import owes_prompt_logprobs
from jaxvllm.core.swap_space import SwapSpace


def pick_victim(running: list[Request], index: int, policy: str) -> Request:
    """Among running requests not yet scheduled this step (index onwards): the newest,
    or under the priority policy the one that ranks last, the newest among equals (the
    oldest preempting itself on a tie would let equals thrash without progress)."""
    if policy == "priority":
        return max(reversed(running[index:]), key=lambda r: (r.priority, r.arrival_time))
    return running[-1]


def preempt(request: Request, kv_cache_manager: KVCacheManager,
            swap_space: SwapSpace | None) -> list[tuple[int, int]] | None:
    """Swap the request's pages out if there is host room, else drop them to recompute
    later. Returns the swap-out pairs, None when it is recomputed."""
    pairs = None
    if swap_space is not None and not owes_prompt_logprobs(request):
        pairs = swap_space.swap_out(request.request_id, kv_cache_manager.get_block_ids(request.request_id))
    kv_cache_manager.free(request)
    if pairs is None:
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
    else:
        request.status = RequestStatus.SWAPPED
    # A token in flight still arrives (update_from_output appends it): it was computed.
    request.num_output_placeholders = 0
    request.num_preemptions += 1
    return pairs
