"""The KV cache pool from per-layer specs (core/kv_cache_interface.py): layers with equal
specs form one group, a block spans every layer of every group, and the pool is the memory
offered over the bytes of one block (or exactly num_gpu_blocks_override blocks)."""
from __future__ import annotations

import pytest

from jaxvllm.core.kv_cache_interface import KVCacheConfig, KVCacheSpec, get_kv_cache_config
from jaxvllm.serial_utils import decode, encode

FULL = KVCacheSpec(block_size=16, page_size_bytes=1024)


def test_one_group_of_full_attention_layers_sizes_the_pool():
    specs = {f"layers.{i}.self_attn": FULL for i in range(4)}
    config = get_kv_cache_config(specs, 100 * 4096 + 4095, swap_space_bytes=10 * 4096, max_model_len=64)
    assert config.num_blocks == 100 and config.num_swap_blocks == 10
    assert [g.layer_names for g in config.kv_cache_groups] == [list(specs)]
    assert config.block_bytes == 4 * 1024 and config.block_size == 16
    assert decode(KVCacheConfig, encode(config)) == config  # crosses to worker processes


def test_a_second_kind_of_layer_is_a_second_group_in_the_same_pool():
    window = KVCacheSpec(block_size=16, page_size_bytes=1024, sliding_window=512)
    draft = KVCacheSpec(block_size=16, page_size_bytes=256)
    specs = {"layers.0.self_attn": window, "layers.1.self_attn": FULL, "layers.2.self_attn": window,
             "draft.layers.0.self_attn": draft}
    config = get_kv_cache_config(specs, 10 * (3 * 1024 + 256), max_model_len=64)
    assert [(g.layer_names, g.kv_cache_spec) for g in config.kv_cache_groups] == [
        (["layers.0.self_attn", "layers.2.self_attn"], window), (["layers.1.self_attn"], FULL),
        (["draft.layers.0.self_attn"], draft)]
    assert config.num_blocks == 10


def test_override_and_limits():
    specs = {"layers.0.self_attn": FULL}
    assert get_kv_cache_config(specs, None, num_gpu_blocks_override=7, max_model_len=64).num_blocks == 7
    with pytest.raises(ValueError, match=r"budget \(1024 bytes\) holds fewer than 2 blocks of 1024 bytes"):
        get_kv_cache_config(specs, 1024, max_model_len=8)
    with pytest.raises(ValueError, match=r"holds 32 tokens .* fewer than max_model_len \(64\)"):
        get_kv_cache_config(specs, 3 * 1024, max_model_len=64)
    with pytest.raises(ValueError, match="share one block size"):
        get_kv_cache_config({"a": FULL, "b": KVCacheSpec(32, 1024)}, 10**6, max_model_len=8)
