"""SwapSpace: the host-memory slots that swap preemption copies KV blocks into.

Bookkeeping only; the bytes live in the worker's host array, indexed by these slot ids.
Swapping keeps a preempted request's progress (its computed KV survives on the host), at
the price of copying its blocks out and back; when the slots run short the scheduler
falls back to recompute.
"""
from __future__ import annotations


class SwapSpace:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out low slots first
        self.req_to_slots: dict[str, list[int]] = {}

    def get_num_free_slots(self) -> int:
        return len(self._free)

    def swap_out(self, req_id: str, block_ids: list[int]) -> list[tuple[int, int]] | None:
        """Slots for the request's blocks, as (device block id, host slot) pairs, or None
        when the space is short (nothing is taken then)."""
        if len(block_ids) > len(self._free):
            return None
        slots = [self._free.pop() for _ in block_ids]
        self.req_to_slots[req_id] = slots
        return list(zip(block_ids, slots))

    def swap_in(self, req_id: str, block_ids: list[int]) -> list[tuple[int, int]]:
        """Release the request's slots, paired as (host slot, device block id) with the
        first of its freshly allocated blocks."""
        slots = self.req_to_slots.pop(req_id)
        self._free.extend(reversed(slots))
        return list(zip(slots, block_ids))

    def free(self, req_id: str) -> None:
        """Drop a swapped request's slots without copying back (it was aborted)."""
        self._free.extend(reversed(self.req_to_slots.pop(req_id, [])))
