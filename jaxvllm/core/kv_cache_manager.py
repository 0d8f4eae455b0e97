"""KVCacheManager: which pages each request owns, per KV cache group, allocated as its tokens
arrive, and which of a new request's pages can be taken from the prefix cache instead of
computed (vLLM's KVCacheManager over its KVCacheCoordinator).

Each group (full attention, a sliding window: core/kv_cache_interface.py) keeps its own
block table per request (core/single_type_kv_cache_manager.py), all from one BlockPool; the
tables have equal lengths, a sliding group's holding the null block before its window. A
prefix hit is as long as every group can serve.
"""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.core.block_pool import BlockHash, BlockPool, KVCacheBlock
from jaxvllm.core.kv_cache_interface import KVCacheSpec
from jaxvllm.core.request import Request
from jaxvllm.core.single_type_kv_cache_manager import cdiv, make_manager

__all__ = ["KVCacheBlocks", "KVCacheManager", "PrefixCacheStats", "cdiv"]


@dataclass
class KVCacheBlocks:
    """Blocks per group in block-table order: an allocation's new blocks, or a prefix hit."""
    blocks: tuple[list[KVCacheBlock], ...]

    def get_block_ids(self) -> tuple[list[int], ...]:
        return tuple([b.block_id for b in group] for group in self.blocks)


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
                 enable_caching: bool = False, model_name: str = "",
                 kv_cache_specs: list[KVCacheSpec] | None = None, use_eagle: bool = False):
        """kv_cache_specs: each group's spec (default: one full-attention group). use_eagle:
        an EAGLE-3 head drafts (a prefix hit leaves its last block to compute)."""
        self.use_eagle = use_eagle
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.model_name = model_name
        self.block_pool = BlockPool(num_blocks, enable_caching)
        specs = kv_cache_specs or [KVCacheSpec(block_size, 0)]
        self.managers = [make_manager(spec, self.block_pool, g) for g, spec in enumerate(specs)]
        self.num_groups = len(self.managers)
        self.sliding_managers = [m for m in self.managers if hasattr(m, "sliding_window")]
        self._no_new_blocks = KVCacheBlocks(tuple([] for _ in self.managers))
        # How many of a request's blocks are registered in the prefix cache already.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def empty_kv_cache_blocks(self) -> KVCacheBlocks:
        return self._no_new_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    # ---- prefix caching ------------------------------------------------------------
    def _update_block_hashes(self, request: Request, num_full_blocks: int) -> list[BlockHash]:
        """Extend the request's chained block hashes to its first `num_full_blocks` blocks.
        The first block carries the model, the cache salt and the LoRA adapter as extra keys,
        and every later hash chains on it, so neither two models, two salts nor two adapters
        ever share a block."""
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
            lora = request.lora_request
            extra = (self.model_name, request.cache_salt, lora and lora.lora_int_id) if i == 0 else None
            hashes.append(BlockHash(hash((parent, block_tokens, extra)), block_tokens, extra))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int]:
        """The longest cached prefix of full blocks that every group can serve, and its
        length in tokens (vLLM's HybridKVCacheCoordinator: each group's hit bounds the
        next search, until all agree). Never the whole sequence: its last token is always
        computed, to produce logits."""
        if not self.enable_caching:
            return self._no_new_blocks, 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._update_block_hashes(request, max_blocks)
        hits, length = self._longest_hit(hashes, max_blocks * self.block_size)
        if self.use_eagle and length:
            # An EAGLE-3 head's KV at a block's last position holds the token after the block,
            # which its hash does not cover: that block is computed again (as vLLM does).
            hits, length = self._longest_hit(hashes, length - self.block_size)
        return KVCacheBlocks(tuple(hits)), length

    def _longest_hit(self, hashes, length: int) -> tuple[list, int]:
        hits = [None] * self.num_groups
        while True:
            for g, manager in enumerate(self.managers):
                hits[g] = manager.find_longest_cache_hit(hashes, length)
                length = len(hits[g]) * self.block_size
            if all(len(h) * self.block_size == length for h in hits):
                return hits, length

    def reset_prefix_cache(self) -> bool:
        return self.block_pool.reset_prefix_cache()

    # ---- allocation ----------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: KVCacheBlocks | None = None,
                       num_new_computed_tokens: int = 0, num_lookahead_tokens: int = 0,
                       delay_cache_blocks: bool = False) -> KVCacheBlocks | None:
        """Grow the request's block table to hold `num_new_tokens` more tokens, after
        taking `new_computed_blocks` (a prefix hit, at admission) into it, and room for
        `num_lookahead_tokens` past them (a draft model's KV for its drafts), within max_model_len.
        delay_cache_blocks: the new pages are filled later (a KV connector's asynchronous
        load), so they enter the prefix cache only when the request is next scheduled.

        Returns the newly added blocks (possibly none), or None when the pool cannot
        satisfy the request; then nothing is allocated and the caller may preempt.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        req_id = request.request_id
        for manager in self.sliding_managers:
            manager.remove_skipped_blocks(req_id, request.num_computed_tokens)
        tables = [m.req_to_blocks.setdefault(req_id, []) for m in self.managers]
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
        num_required = -(-min(num_tokens + num_lookahead_tokens, max(num_tokens, self.max_model_len))
                         // self.block_size)
        computed = new_computed_blocks.blocks if new_computed_blocks is not None else None
        # Equal in every group, but where a swapped request resumes: its sliding groups
        # start with null entries up to their window.
        if computed is None:
            needs = [num_required - len(t) for t in tables]
            skips = [0] * len(tables)
            if not tables[0] and request.num_computed_tokens and self.sliding_managers:
                skips = [m.num_skipped_blocks(request.num_computed_tokens) for m in self.managers]
                needs = [n - k for n, k in zip(needs, skips)]
        else:
            needs = [num_required - len(t) - len(c) for t, c in zip(tables, computed)]
        num_full = 0
        if self.enable_caching:
            # Only tokens whose ids are known can key the cache (async scheduling computes
            # one whose id is still on the device).
            num_full = min(num_tokens, request.num_tokens) // self.block_size
        if (computed is None and max(needs) <= 0 and (
                not self.enable_caching or num_full <= self.num_cached_block.get(req_id, 0))):
            return self._no_new_blocks  # most decode steps: the last block still has room
        num_free = self.block_pool.get_num_free_blocks()
        if computed is not None:
            # Hit blocks nobody holds sit in the free queue: they cannot also be handed out new.
            num_free -= sum(1 for group in computed for b in group if b.ref_cnt == 0)
        if sum(n for n in needs if n > 0) > num_free:
            return None
        if computed is not None:
            stats = self.prefix_cache_stats
            stats.requests += 1
            stats.queries += request.num_tokens - request.num_computed_tokens
            stats.hits += num_new_computed_tokens
            for table, group in zip(tables, computed):
                self.block_pool.touch(group)
                table.extend(group)
        else:
            null = self.block_pool.null_block
            for table, k in zip(tables, skips):
                table.extend([null] * k)
        new_blocks = tuple(self.block_pool.get_new_blocks(n) if n > 0 else [] for n in needs)
        for table, new in zip(tables, new_blocks):
            table.extend(new)
        if delay_cache_blocks:
            self.num_cached_block[req_id] = num_new_computed_tokens // self.block_size
        elif self.enable_caching:
            num_cached = self.num_cached_block.get(req_id, 0)
            if num_full > num_cached:
                hashes = self._update_block_hashes(request, num_full)
                for g, table in enumerate(tables):
                    self.block_pool.cache_full_blocks(table, hashes, num_cached, num_full, g)
                self.num_cached_block[req_id] = num_full
        return KVCacheBlocks(new_blocks)

    def free(self, request: Request) -> None:
        """Return every block of the request to the pool at once, group by group (each
        group's tail first, so later, less shared blocks are evicted before a prefix)."""
        for manager in self.managers:
            manager.free(request.request_id)
        self.num_cached_block.pop(request.request_id, None)

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's block table of each group."""
        return KVCacheBlocks(tuple(list(m.req_to_blocks.get(request_id, [])) for m in self.managers))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block table of each group (0: the null block, out of a window)."""
        return tuple([b.block_id for b in m.req_to_blocks.get(request_id, [])] for m in self.managers)

    def num_blocks_held(self, request_id: str) -> int:
        """Blocks the request holds over all groups (null entries excluded)."""
        null = self.block_pool.null_block
        return sum(b is not null for m in self.managers for b in m.req_to_blocks.get(request_id, []))
