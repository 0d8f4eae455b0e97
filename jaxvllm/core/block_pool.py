"""BlockPool: the free list of fixed-size KV-cache pages.

Block ids index the page axis of the device KV array. Block 0 is the null block: it is
never handed out, and padding tokens write their K/V into it so that padded slots can
never touch a page that a request owns.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(eq=False)
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0


class BlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is the null block), got {num_blocks}.")
        self.num_blocks = num_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # permanently held, so it is never freed
        self._free = deque(self.blocks[1:])

    def get_num_free_blocks(self) -> int:
        return len(self._free)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > len(self._free):
            raise ValueError(f"Cannot get {num_blocks} blocks: only {len(self._free)} are free.")
        blocks = [self._free.popleft() for _ in range(num_blocks)]
        for block in blocks:
            block.ref_cnt += 1
        return blocks

    def free_blocks(self, blocks) -> None:
        """Drop one reference from each block; blocks nobody holds return to the free list."""
        for block in blocks:
            if block.ref_cnt <= 0 or block is self.null_block:
                raise RuntimeError(f"Block {block.block_id} freed more often than allocated.")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free.append(block)

    def get_usage(self) -> float:
        """Fraction of usable blocks (the null block excluded) currently in use."""
        return 1.0 - len(self._free) / (self.num_blocks - 1)
