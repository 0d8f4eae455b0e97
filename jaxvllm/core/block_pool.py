"""BlockPool: the fixed-size KV-cache pages, their reference counts, and the prefix cache.

Block ids index the page axis of the device KV array. Block 0 is the null block: it is
never handed out, and padding tokens write their K/V into it so that padded slots can
never touch a page that a request owns.

With prefix caching, a full block is registered under its `BlockHash` and its KV cache
group (each group's pages of the same tokens are different blocks), and keeps both and its
content after it is freed, until it is popped for reuse. Free blocks are taken
from the head of the free queue, so the least recently freed one is evicted first; a hit
on a free cached block takes it back out of the queue.
"""
from __future__ import annotations

from jaxvllm.core.free_queue import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock

__all__ = ["BlockHash", "BlockPool", "KVCacheBlock"]


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = False):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be at least 2 (one is the null block), got {num_blocks}.")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # permanently held, so it is never freed
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[1:])
        # Several blocks may hold the same content (two requests computed it at once).
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        # A KV connector that keeps evicted blocks (the host tier) sets a list here: each
        # eviction appends (block id, hash, group) before the block's page is reused.
        self.evictions: list[tuple[int, BlockHash, int]] | None = None

    def get_num_free_blocks(self) -> int:
        """Blocks nobody holds, cached or not: all of them can be handed out."""
        return self.free_block_queue.num_free_blocks

    def get_cached_block(self, block_hash: BlockHash, group_id: int = 0) -> KVCacheBlock | None:
        for block in self.cached_block_hash_to_block.get(block_hash, {}).values():
            if block.group_id == group_id:
                return block
        return None

    def cache_full_blocks(self, blocks: list[KVCacheBlock], block_hashes: list[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int, group_id: int = 0) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks], which now hold full blocks
        of tokens (or will, once this step's forward has written them); a sliding group's
        null entries (out of its window) are skipped."""
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None or block is self.null_block:  # a prefix hit: registered
                continue
            block.block_hash, block.group_id = block_hashes[i], group_id
            self.cached_block_hash_to_block.setdefault(block.block_hash, {})[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"Cannot get {num_blocks} blocks: only {self.get_num_free_blocks()} are free.")
        blocks = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._maybe_evict_cached_block(block)
            block.ref_cnt += 1
            blocks.append(block)
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        same = self.cached_block_hash_to_block[block.block_hash]
        del same[block.block_id]
        if not same:
            del self.cached_block_hash_to_block[block.block_hash]
        if self.evictions is not None:
            self.evictions.append((block.block_id, block.block_hash, block.group_id))
        block.block_hash = None

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks; a free one leaves the free queue."""
        for block in blocks:
            if block is self.null_block:  # a sliding group's hit starts with them
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        """Drop one reference from each block; blocks nobody holds go to the free queue's
        tail in the given order, so earlier ones are evicted first. The null block (a sliding
        group's entries out of its window) is skipped."""
        for block in ordered_blocks:
            if block is self.null_block:
                continue
            if block.ref_cnt <= 0:
                raise RuntimeError(f"Block {block.block_id} freed more often than allocated.")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block (new weights, a benchmark's cold start). Only when no
        request holds a block: a running request's blocks stay valid for it."""
        if self.get_num_free_blocks() != self.num_blocks - 1:
            return False
        for block in self.blocks:
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        return True

    def get_usage(self) -> float:
        """Fraction of usable blocks (the null block excluded) currently held by requests."""
        return 1.0 - self.get_num_free_blocks() / (self.num_blocks - 1)
