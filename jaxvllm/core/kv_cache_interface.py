"""What the KV cache holds, per layer, and how the engine sizes its pool from that (vLLM's
kv_cache_interface and get_kv_cache_config).

The worker reports a KVCacheSpec per attention layer (`Worker.get_kv_cache_spec`); the
engine groups layers with equal specs, divides the memory the worker offers by the bytes a
block takes over all of them, and hands the result (KVCacheConfig) to the worker, which
allocates it, and to the scheduler, which allocates its blocks. Today every layer of a model
is one group of full-attention pages; a sliding-window group or a draft model's layers are
more groups in the same config, not another path.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class KVCacheSpec:
    """One layer's pages: `block_size` tokens each, `page_size_bytes` over the whole mesh
    (the platform's layout, padding included). sliding_window: tokens a layer attends back,
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
    """The pool the engine chose: `num_blocks` blocks, each holding a page of every layer of
    every group; `num_swap_blocks` host slots for swap preemption."""
    num_blocks: int
    kv_cache_groups: list[KVCacheGroupSpec] = field(default_factory=list)
    num_swap_blocks: int = 0

    @property
    def block_size(self) -> int:
        return self.kv_cache_groups[0].kv_cache_spec.block_size

    @property
    def block_bytes(self) -> int:
        """Bytes one block takes over all layers."""
        return block_bytes(self.kv_cache_groups)


def group_layers(specs: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Layers with equal specs form one group, in the order their first layer comes."""
    groups: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        groups.setdefault(spec, []).append(name)
    return [KVCacheGroupSpec(names, spec) for spec, names in groups.items()]


def block_bytes(groups: list[KVCacheGroupSpec]) -> int:
    return sum(len(g.layer_names) * g.kv_cache_spec.page_size_bytes for g in groups)


def get_kv_cache_config(specs: dict[str, KVCacheSpec], available_bytes: int | None, *,
                        num_gpu_blocks_override: int | None = None, swap_space_bytes: int = 0,
                        max_model_len: int) -> KVCacheConfig:
    """The pool for `specs` in `available_bytes` (the worker's budget over its mesh), or
    exactly num_gpu_blocks_override blocks. Every group shares the block size: one block id
    names the page of every layer, so one block table per request serves all groups."""
    groups = group_layers(specs)
    if not groups:
        raise ValueError("The model reports no KV cache layers.")
    sizes = {g.kv_cache_spec.block_size for g in groups}
    if len(sizes) > 1:
        raise ValueError(f"KV cache groups must share one block size, got {sorted(sizes)}.")
    per_block = block_bytes(groups)
    if num_gpu_blocks_override is not None:
        num_blocks = num_gpu_blocks_override
    else:
        num_blocks = available_bytes // per_block
        if num_blocks < 2:
            raise ValueError(f"The KV cache budget ({available_bytes} bytes) holds fewer than 2 blocks of "
                             f"{per_block} bytes; raise kv_cache_memory_bytes or hbm_utilization.")
    bs = groups[0].kv_cache_spec.block_size
    if (num_blocks - 1) * bs < max_model_len:
        raise ValueError(
            f"The KV cache holds {(num_blocks - 1) * bs} tokens ({num_blocks - 1} usable blocks of "
            f"{bs}), fewer than max_model_len ({max_model_len}); raise the KV cache budget "
            f"(kv_cache_memory_bytes, num_gpu_blocks_override) or lower max_model_len.")
    return KVCacheConfig(num_blocks, groups, swap_space_bytes // per_block)
