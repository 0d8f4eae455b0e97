"""What the KV cache holds, per layer, and how the engine sizes its pool from that (vLLM's
kv_cache_interface and get_kv_cache_config).

The worker reports a KVCacheSpec per attention layer (`Worker.get_kv_cache_spec`); the
engine groups layers with equal specs (full attention; sliding window W), divides the memory
the worker offers by the bytes a block takes, and hands the result (KVCacheConfig) to the
worker, which allocates it, and to the scheduler, which keeps a block table per group
(core/kv_cache_manager.py): a sliding group holds only its window's blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's pages: `block_size` tokens each, `page_size_bytes` over the whole mesh
    (the backend's layout, padding included). sliding_window: tokens a layer attends back,
    None for full attention (its pages are kept for the whole sequence)."""
    block_size: int
    page_size_bytes: int
    sliding_window: int | None = None


@dataclass(frozen=True)
class KVCacheGroupSpec:
    """Layers whose pages share one spec (and so one block table per request)."""
    layer_names: list[str]
    kv_cache_spec: KVCacheSpec


@dataclass(frozen=True)
class KVCacheConfig:
    """The pool the engine chose: `num_blocks` blocks, `num_swap_blocks` host slots for swap
    preemption. A block is one page of `num_slots` layers: every group owns whole blocks
    (block tables per group, one pool), and the i-th layer of each group keeps its pages in
    the cache's slot i (vLLM's hybrid allocator), so a block id names one group's pages."""
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
    num_swap_blocks: int = 0

    @property
    def block_size(self) -> int:
        return self.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def num_slots(self) -> int:
        return max(len(g.layer_names) for g in self.kv_cache_groups)

    @property
    def block_bytes(self) -> int:
        """Bytes one block takes: a page of each slot."""
        return block_bytes(self.kv_cache_groups)

    def layer_slots(self) -> dict[str, tuple[int, int]]:
        """Layer name -> (its group, its slot in the cache)."""
        return {name: (g, i) for g, group in enumerate(self.kv_cache_groups)
                for i, name in enumerate(group.layer_names)}


def group_layers(specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Layers with equal specs form one kind, in the order their first layer comes. With
    several kinds, each is cut into groups of as many layers as the smallest kind has (the
    last group of a kind may be short), so that every group fills the same slots of a block
    (vLLM's _get_kv_cache_groups_uniform_page_size): Gemma 3's 15 sliding and 3 global
    layers are five sliding groups and one global group of 3 layers."""
    kinds: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        kinds.setdefault(spec, []).append(name)
    size = min(len(names) for names in kinds.values()) if kinds else 0
    if len(kinds) == 1:
        size = len(next(iter(kinds.values())))
    return [KVCacheGroupSpec(names[i:i + size], spec) for spec, names in kinds.items()
            for i in range(0, len(names), size)]


def block_bytes(groups: list[KVCacheGroupSpec]) -> int:
    return max(len(g.layer_names) for g in groups) * groups[0].kv_cache_spec.page_size_bytes


def blocks_per_request(groups: list[KVCacheGroupSpec], num_tokens: int, num_step_tokens: int = 1) -> int:
    """Blocks one request of num_tokens holds at most in a step of num_step_tokens of it
    (1: decoding): every token's for full attention, for a sliding group the window before
    the step's tokens and those (vLLM's SlidingWindowSpec.max_memory_usage_bytes)."""
    total = 0
    for g in groups:
        spec = g.kv_cache_spec
        n = -(-num_tokens // spec.block_size)
        if spec.sliding_window is not None:
            n = min(n, -(-(spec.sliding_window - 1 + num_step_tokens) // spec.block_size) + 1)
        total += n
    return total


def describe_groups(groups: list[KVCacheGroupSpec]) -> str:
    """'sliding window 512: 15 layers in 5 groups, full attention: 3 layers in 1 group'."""
    kinds: dict[int | None, list[int]] = {}
    for g in groups:
        kinds.setdefault(g.kv_cache_spec.sliding_window, []).append(len(g.layer_names))
    return ", ".join(f"{'full attention' if w is None else f'sliding window {w}'}: {sum(n)} layers in "
                     f"{len(n)} group{'s' * (len(n) > 1)}" for w, n in kinds.items())


def get_kv_cache_config(specs: dict[str, KVCacheSpec], available_bytes: int | None, *,
                        num_gpu_blocks_override: int | None = None, swap_space_bytes: int = 0,
                        max_model_len: int, max_num_batched_tokens: int = 1) -> KVCacheConfig:
    """The pool for `specs` in `available_bytes` (the worker's budget over its mesh), or
    exactly num_gpu_blocks_override blocks, at least what one request of max_model_len
    holds in a step of max_num_batched_tokens. Every group shares the block size and the
    page size: a block is the same bytes whichever group holds it."""
    groups = group_layers(specs)
    if not groups:
        raise ValueError("The model reports no KV cache layers.")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"KV cache groups must share one block size, got {sorted(sizes)}.")
    pages = {g.kv_cache_spec.page_size_bytes for g in groups}
    if len(pages) > 1:
        raise ValueError(f"KV cache groups must share one page size, got {sorted(pages)} bytes.")
    per_block = block_bytes(groups)
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    else:
        num_blocks = available_bytes // per_block
        if num_blocks < 2:
            raise ValueError(f"The KV cache budget ({available_bytes} bytes) holds fewer than 2 blocks of "
                             f"{per_block} bytes; raise kv_cache_memory_bytes or hbm_utilization.")
    bs = groups[0].kv_cache_spec.block_size
    need = blocks_per_request(groups, max_model_len, max_num_batched_tokens)
    if num_blocks - 1 < need:
        raise ValueError(
            f"The KV cache holds {num_blocks - 1} usable blocks of {bs} tokens, fewer than max_model_len "
            f"({max_model_len}) needs ({need} blocks over {len(groups)} KV cache group(s)); raise the KV "
            f"cache budget (kv_cache_memory_bytes, num_gpu_blocks_override) or lower max_model_len.")
    return KVCacheConfig(num_blocks, groups, swap_space_bytes // per_block)
