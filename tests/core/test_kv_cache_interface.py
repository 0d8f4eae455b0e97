"""The KV cache pool from per-layer specs (core/kv_cache_interface.py): layers with equal
specs form one kind, cut into groups of equal size when there are several kinds, a block is
a page of each slot, and the pool is the memory offered over the bytes of one block (or
exactly num_gpu_blocks_override blocks)."""
from __future__ import annotations

import pytest

from jaxvllm.core.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    blocks_per_request,
    describe_groups,
    get_kv_cache_config,
)
from jaxvllm.serial_utils import decode, encode

FULL = KVCacheSpec(block_size=16, page_size_bytes=1024)


def test_one_group_of_full_attention_layers_sizes_the_pool():
    specs = {f"layers.{i}.self_attn": FULL for i in range(4)}
    config = get_kv_cache_config(specs, 100 * 4096 + 4095, swap_space_bytes=10 * 4096, max_model_len=64)
    assert config.num_blocks == 100 and config.num_swap_blocks == 10
    assert [g.layer_names for g in config.kv_cache_groups] == [list(specs)]
    assert config.block_bytes == 4 * 1024 and config.block_size == 16
    assert decode(KVCacheConfig, encode(config)) == config  # crosses to worker processes


def test_kinds_of_layers_are_cut_into_groups_of_equal_size_sharing_the_blocks():
    """Gemma 3's pattern (5 sliding : 1 global): groups of 3 layers, a block is 3 pages, and
    a full-length request holds its whole length in the global group only."""
    window = KVCacheSpec(block_size=16, page_size_bytes=1024, sliding_window=512)
    specs = {f"layers.{i}.self_attn": FULL if i % 6 == 5 else window for i in range(18)}
    config = get_kv_cache_config(specs, 3000 * 3 * 1024, max_model_len=32768)
    assert [(len(g.layer_names), g.kv_cache_spec) for g in config.kv_cache_groups] == [(3, window)] * 5 + [(3, FULL)]
    assert config.kv_cache_groups[-1].layer_names == [f"layers.{i}.self_attn" for i in (5, 11, 17)]
    assert config.num_slots == 3 and config.block_bytes == 3 * 1024 and config.num_blocks == 3000
    assert config.layer_slots()["layers.4.self_attn"] == (1, 1)  # sliding layers 3, 4, 6: the 2nd group
    assert blocks_per_request(config.kv_cache_groups, 32768) == 2048 + 5 * (32 + 1)
    assert describe_groups(config.kv_cache_groups) == ("sliding window 512: 15 layers in 5 groups, "
                                                       "full attention: 3 layers in 1 group")
    assert decode(KVCacheConfig, encode(config)) == config
    with pytest.raises(ValueError, match="share one page size"):
        get_kv_cache_config({"a": FULL, "b": KVCacheSpec(16, 256, 8)}, 10**6, max_model_len=8)


def test_override_and_limits():
    specs = {"layers.0.self_attn": FULL}
    assert get_kv_cache_config(specs, None, num_gpu_blocks_override=7, max_model_len=64).num_blocks == 7
    with pytest.raises(ValueError, match=r"budget \(1024 bytes\) holds fewer than 2 blocks of 1024 bytes"):
        get_kv_cache_config(specs, 1024, max_model_len=8)
    with pytest.raises(ValueError, match=r"holds 2 usable blocks of 16 tokens, fewer than max_model_len "
                                         r"\(64\) needs \(4 blocks over 1 KV cache group\(s\)\)"):
        get_kv_cache_config(specs, 3 * 1024, max_model_len=64)
    with pytest.raises(ValueError, match="share one block size"):
        get_kv_cache_config({"a": FULL, "b": KVCacheSpec(32, 1024)}, 10**6, max_model_len=8)
