"""KVCacheManager: which pages each request owns, allocated as its tokens arrive, and
which of a new request's pages can be taken from the prefix cache instead of computed."""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from jaxvllm.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class KVCacheBlocks:
    """Blocks in block-table order: an allocation's new blocks, or a prefix-cache hit."""
    blocks: list[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


_NO_NEW_BLOCKS = KVCacheBlocks([])


@dataclass
class PrefixCacheStats:
    """Counted per admitted request, in tokens: queries are prompt (and resumed output)
    tokens looked up, hits the ones found cached."""
    requests: int = 0
    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int,
                 enable_caching: bool = False, model_name: str = ""):
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.model_name = model_name
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # How many of a request's blocks are registered in the prefix cache already.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # ---- prefix caching ------------------------------------------------------------
    def _update_block_hashes(self, request: Request, num_full_blocks: int) -> list[BlockHash]:
        """Extend the request's chained block hashes to its first `num_full_blocks` blocks.
        The first block carries the model and the cache salt as extra keys, and every later
        hash chains on it, so neither two models nor two salts ever share a block."""
        hashes, bs = request.block_hashes, self.block_size
        prompt, outputs = request.prompt_token_ids, request.output_token_ids
        num_prompt = len(prompt)
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            start, end = i * bs, (i + 1) * bs
            if end <= num_prompt:  # slices, not all_token_ids: no copy of the whole sequence
                block_tokens = tuple(prompt[start:end])
            else:
                block_tokens = tuple(prompt[start:end]) + tuple(outputs[max(0, start - num_prompt):end - num_prompt])
            parent = hashes[-1].hash_value if hashes else None
            extra = (self.model_name, request.cache_salt) if i == 0 else None
            hashes.append(BlockHash(hash((parent, block_tokens, extra)), block_tokens, extra))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of full blocks and its length in tokens. Never the
        whole sequence: its last token is always computed, to produce logits."""
        if not self.enable_caching:
            return KVCacheBlocks([]), 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._update_block_hashes(request, max_blocks)[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return KVCacheBlocks(hits), len(hits) * self.block_size

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # ---- allocation ----------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_new_computed_tokens: int = 0) -> KVCacheBlocks | None:
        """Grow the request's block table to hold `num_new_tokens` more tokens, after
        taking `new_computed_blocks` (a prefix hit, at admission) into it.

        Returns the newly added blocks (possibly none), or None when the pool cannot
        satisfy the request; then nothing is allocated and the caller may preempt.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        req_id = request.request_id
        blocks = self.req_to_blocks.get(req_id)
        if blocks is None:
            blocks = self.req_to_blocks[req_id] = []
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_needed = -(-num_tokens // self.block_size) - len(blocks)
        num_full = 0
        if self.enable_caching:
            # Only tokens whose ids are known can key the cache (async scheduling computes
            # one whose id is still on the device).
            num_full = min(num_tokens, request.num_tokens) // self.block_size
        if (new_computed_blocks is None and num_needed <= 0 and (
                not self.enable_caching or num_full <= self.num_cached_block.get(req_id, 0))):
            return _NO_NEW_BLOCKS  # most decode steps: the last block still has room
        if new_computed_blocks is None:
            # The hot path (a running request's next tokens): usually no new block at all.
            if num_needed > self.block_pool.get_num_free_blocks():
                return None
            new_blocks = self.block_pool.get_new_blocks(num_needed) if num_needed > 0 else []
            blocks.extend(new_blocks)
        else:
            computed = new_computed_blocks.blocks
            num_needed -= len(computed)
            # Hit blocks nobody holds sit in the free queue: they cannot also be handed out new.
            num_free = self.block_pool.get_num_free_blocks() - sum(1 for b in computed if b.ref_cnt == 0)
            if num_needed > num_free:
                return None
            stats = self.prefix_cache_stats
            stats.requests += 1
            stats.queries += request.num_tokens - request.num_computed_tokens
            stats.hits += num_new_computed_tokens
            self.block_pool.touch(computed)
            blocks.extend(computed)
            new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
            blocks.extend(new_blocks)
        if self.enable_caching:
            num_cached = self.num_cached_block.get(req_id, 0)
            if num_full > num_cached:
                hashes = self._update_block_hashes(request, num_full)
                self.block_pool.cache_full_blocks(blocks, hashes, num_cached, num_full)
                self.num_cached_block[req_id] = num_full
        return KVCacheBlocks(new_blocks)

    def free(self, request: Request) -> None:
        """Return every block of the request to the pool at once.

        Tail blocks go back first so that a request's later (less shared) blocks are
        evicted before its prefix.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
