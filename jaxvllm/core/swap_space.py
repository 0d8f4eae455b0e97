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

    def swap_out(self, req_id: str, block_ids: tuple[list[int], ...]) -> list[tuple[int, int]] | None:
        """Slots for the request's blocks (its table per KV cache group; null entries, 0,
        hold nothing), as (device block id, host slot) pairs, or None when the space is
        short (nothing is taken then)."""
        held = [(g, i, b) for g, table in enumerate(block_ids) for i, b in enumerate(table) if b]
        if len(held) > len(self._free):
            return None
        slots = [(g, i, self._free.pop()) for g, i, _ in held]
        self.req_to_slots[req_id] = slots
        return [(b, slot) for (_, _, b), (_, _, slot) in zip(held, slots)]

    def swap_in(self, req_id: str, block_ids: tuple[list[int], ...]) -> list[tuple[int, int]]:
        """Release the request's slots, paired as (host slot, device block id) with the
        blocks at the same places of its fresh tables; a block a sliding window has passed
        meanwhile (null now) is not copied back."""
        slots = self.req_to_slots.pop(req_id)
        self._free.extend(slot for _, _, slot in reversed(slots))
        return [(slot, block_ids[g][i]) for g, i, slot in slots if i < len(block_ids[g]) and block_ids[g][i]]

    def free(self, req_id: str) -> None:
        """Drop a swapped request's slots without copying back (it was aborted)."""
        self._free.extend(slot for _, _, slot in reversed(self.req_to_slots.pop(req_id, [])))
