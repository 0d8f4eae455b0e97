"""FreeKVCacheBlockQueue: the block pool's free list as an intrusive doubly linked list.

A deque cannot drop an element from its middle in O(1), and prefix caching needs exactly
that: a freed block stays in the free list with its content until it is reused, and a
cache hit pulls it back out from wherever it sits. The links live on the blocks
themselves, so popping from the head (the least recently freed block, the one to evict),
removing from the middle and appending at the tail are all O(1) with no allocation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class BlockHash(NamedTuple):
    """A full block's identity: chained on its parent's hash, so equal hashes mean an equal
    prefix. The token ids and extra keys are kept so that a dict lookup compares them too,
    and a collision of `hash_value` alone can never alias two different blocks."""
    hash_value: int
    token_ids: tuple[int, ...]
    extra_keys: tuple | None = None


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    # Set while the block holds a full, cached block of tokens; cleared on eviction.
    block_hash: BlockHash | None = None
    group_id: int = 0  # the KV cache group whose pages it holds while cached
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:  # the links would recurse through the whole list
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hashed={self.block_hash is not None})"


class FreeKVCacheBlockQueue:
    def __init__(self, blocks: list[KVCacheBlock]):
        self.num_free_blocks = len(blocks)
        # Sentinels: every real block always has both neighbours, so no branch on the ends.
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        prev = self._head
        for block in blocks:
            prev.next_free_block, block.prev_free_block = block, prev
            prev = block
        prev.next_free_block, self._tail.prev_free_block = self._tail, prev

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("No free block left.")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        prev, nxt = block.prev_free_block, block.next_free_block
        if prev is None or nxt is None:
            raise RuntimeError(f"Block {block.block_id} is not in the free queue.")
        prev.next_free_block, nxt.prev_free_block = nxt, prev
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        last.next_free_block, block.prev_free_block = block, last
        block.next_free_block, self._tail.prev_free_block = self._tail, block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Head (next to evict) to tail; for tests and debugging."""
        out, block = [], self._head.next_free_block
        while block is not self._tail:
            out.append(block)
            block = block.next_free_block
        return out
