"""One KV cache group's block tables (vLLM's SingleTypeKVCacheManager): which blocks each
request holds for the group's layers, which of them the prefix cache can serve, and, for a
sliding-window group, which fall out of the window and go back to the pool.

Every group's table of a request has one entry per block of its tokens; a sliding group's
entries before the window are the null block (block 0), as in vLLM, so that a block's index
in the table still says which tokens it holds.
"""
from __future__ import annotations

from jaxvllm.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from jaxvllm.core.kv_cache_interface import KVCacheSpec


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FullAttentionManager:
    """Every block of the sequence is kept: a query attends to all positions before it."""

    def __init__(self, spec: KVCacheSpec, block_pool: BlockPool, group_id: int):
        self.block_size = spec.block_size
        self.block_pool = block_pool
        self.group_id = group_id
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_length: int) -> list[KVCacheBlock]:
        """The cached blocks of the longest prefix of at most max_length tokens."""
        hits = []
        for block_hash in block_hashes[:max_length // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash, self.group_id)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        return 0

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Nothing falls out of full attention."""

    def free(self, request_id: str) -> None:
        """Tail blocks go back first, so a request's later (less shared) blocks are evicted
        before its prefix."""
        self.block_pool.free_blocks(reversed(self.req_to_blocks.pop(request_id, [])))


class SlidingWindowManager(FullAttentionManager):
    """A query at position p attends to positions p - W + 1 .. p: blocks wholly before the
    window of the next query are never read again and return to the pool."""

    def __init__(self, spec: KVCacheSpec, block_pool: BlockPool, group_id: int):
        super().__init__(spec, block_pool, group_id)
        self.sliding_window = spec.sliding_window
        # A hit must hold the window before its end: W - 1 tokens ending at a block boundary.
        self.window_blocks = cdiv(self.sliding_window - 1, self.block_size)

    def find_longest_cache_hit(self, block_hashes: list[BlockHash], max_length: int) -> list[KVCacheBlock]:
        """The longest prefix whose last window_blocks blocks are cached in this group (the
        blocks before them need not be: they are null in the hit), as vLLM decides it: scan
        from the end for that many cached blocks in a row, else the cached run at the start."""
        null, num_blocks = self.block_pool.null_block, max_length // self.block_size
        hits = [null] * num_blocks
        run = 0
        for i in range(num_blocks - 1, -1, -1):
            block = self.block_pool.get_cached_block(block_hashes[i], self.group_id)
            if block is None:
                run = 0
                continue
            hits[i] = block
            run += 1
            if run >= self.window_blocks:
                return hits[:i + run]
        return hits[:run]

    def num_skipped_blocks(self, num_computed_tokens: int) -> int:
        """Blocks wholly before the window of the query at num_computed_tokens."""
        return max(num_computed_tokens - self.sliding_window + 1, 0) // self.block_size

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        """Free the blocks before the window of the query at num_computed_tokens, back to the
        first one freed earlier (null)."""
        blocks = self.req_to_blocks.get(request_id)
        if not blocks:
            return
        first_useful = self.num_skipped_blocks(num_computed_tokens)
        null, removed = self.block_pool.null_block, []
        for i in range(min(first_useful, len(blocks)) - 1, -1, -1):
            if blocks[i] is null:
                break
            removed.append(blocks[i])
            blocks[i] = null
        self.block_pool.free_blocks(removed)


def make_manager(spec: KVCacheSpec, block_pool: BlockPool, group_id: int) -> FullAttentionManager:
    cls = FullAttentionManager if spec.sliding_window is None else SlidingWindowManager
    return cls(spec, block_pool, group_id)
