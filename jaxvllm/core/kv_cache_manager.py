"""KVCacheManager: which pages each request owns, allocated as its tokens arrive."""
from __future__ import annotations

from dataclasses import dataclass

from jaxvllm.core.block_pool import BlockPool, KVCacheBlock
from jaxvllm.core.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass
class KVCacheBlocks:
    """The blocks an allocation handed out, in block-table order."""
    blocks: list[KVCacheBlock]

    def get_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, max_model_len: int):
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.block_pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def allocate_slots(self, request: Request, num_new_tokens: int) -> KVCacheBlocks | None:
        """Grow the request's block table to hold `num_new_tokens` more tokens.

        Returns the newly added blocks (possibly none), or None when the pool cannot
        satisfy the request; then nothing is allocated and the caller may preempt.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be positive, got {num_new_tokens}.")
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
        if num_needed > self.block_pool.get_num_free_blocks():
            return None
        new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
        blocks.extend(new_blocks)
        return KVCacheBlocks(new_blocks)

    def free(self, request: Request) -> None:
        """Return every block of the request to the pool at once.

        Tail blocks go back first so that, once blocks are reused by content, a
        request's later (less shared) blocks are evicted before its prefix.
        """
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
