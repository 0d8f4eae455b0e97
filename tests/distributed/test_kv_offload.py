"""The OffloadingConnector (kv_transfer_config): a host-memory tier under the prefix cache, end
to end on tiny random models. Blocks the small device pool evicts reload from host memory, the
greedy outputs never change, the counters say what moved, and bad settings are refused by name.
(The scheduler's side under random workloads: tests/core/test_scheduler_caching.py's harness.)"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxvllm import LLM, SamplingParams
from jaxvllm.config import EngineArgs
from jaxvllm.config.engine_config import EngineConfig, KVTransferConfig
from jaxvllm.core.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec
from jaxvllm.entrypoints.cli_args import add_engine_flags, engine_args
from jaxvllm.kv_transfer.base import KVConnectorRole
from jaxvllm.kv_transfer.offloading_connector import OffloadingConnectorMetadata
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.worker.kv_connector.offloading_worker import OffloadingConnectorWorker

rng = np.random.default_rng(0)
PREFIXES = [[int(t) for t in rng.integers(3, 256, 96)] for _ in range(8)]  # 6 blocks each
PROMPTS = [p + [int(t) for t in rng.integers(3, 256, 5)] for p in PREFIXES for _ in range(3)]
random.Random(0).shuffle(PROMPTS)
GREEDY = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)


def offload(num_cpu_blocks: int, **extra) -> dict:
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks, **extra}}


def make_llm(path, **kwargs):
    """A pool of 30 blocks of 16: four of the 7-block requests at a time, far from the 56
    blocks of the eight prefixes."""
    args = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, num_gpu_blocks_override=30,
                block_size=16, skip_warmup=True)
    return LLM(str(path), **{**args, **kwargs})


def greedy(llm, prompts):
    return [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY,
                                                        use_tqdm=False)]


def stats(llm):
    return llm.llm_engine.engine_core.get_stats()


def assert_pool_whole(llm):
    sched = llm.llm_engine.engine_core.scheduler
    pool = sched.kv_cache_manager.block_pool
    assert pool.get_num_free_blocks() == pool.num_blocks - 1 and not sched.requests
    tier = sched.connector
    # Every host slot is either keyed or free, once; no load is left pending.
    assert sorted([*tier.slots.values(), *tier._free_slots]) == list(range(tier.num_cpu_blocks))
    assert not tier._loads and not tier._pinned


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    llm = make_llm(tiny_model_dir)
    return greedy(llm, PROMPTS), stats(llm)


@pytest.fixture(scope="module")
def offload_llm(tiny_model_dir):
    """Warmed, with check_recompilation: the connector's copies compile before the first step."""
    return make_llm(tiny_model_dir, kv_transfer_config=offload(256), skip_warmup=False, check_recompilation=True)


def test_host_tier_reloads_evicted_prefixes_with_identical_outputs(reference, offload_llm):
    expected, plain = reference
    assert greedy(offload_llm, PROMPTS) == expected
    s = stats(offload_llm)
    kv = s.kv_connector_stats
    # The device pool alone hit few prefixes; the host tier served many of the evicted ones.
    assert kv["external_prefix_cache_hits"] >= 8 * 16 and kv["external_prefix_cache_hits"] % 16 == 0
    assert kv["external_prefix_cache_queries"] == sum(map(len, PROMPTS))
    assert s.num_prefill_tokens == plain.num_prefill_tokens - kv["external_prefix_cache_hits"]
    assert kv["kv_offload_stored_blocks"] > 0
    row = offload_llm.llm_engine.engine_core.model_executor.driver_worker.kv_connector.copier.row_bytes
    assert kv["DEVICE_to_CPU_total_bytes"] == kv["kv_offload_stored_blocks"] * row
    assert kv["CPU_to_DEVICE_total_bytes"] == kv["external_prefix_cache_hits"] // 16 * row
    assert_pool_whole(offload_llm)


def test_salts_and_resets_keep_host_blocks_apart(offload_llm):
    """A salted prompt never loads another salt's blocks; reset_prefix_cache empties the tier."""
    prompt = PREFIXES[0] + [7, 7, 7]
    other = [PREFIXES[i] + [9] for i in range(1, 6)]  # enough to evict the prompt's blocks

    def hits_after(prompts):
        before = stats(offload_llm).kv_connector_stats["external_prefix_cache_hits"]
        offload_llm.generate(prompts, GREEDY, use_tqdm=False)
        return stats(offload_llm).kv_connector_stats["external_prefix_cache_hits"] - before

    assert offload_llm.reset_prefix_cache()
    hits_after([{"prompt_token_ids": prompt, "cache_salt": "a"}])
    hits_after([{"prompt_token_ids": p} for p in other])
    assert hits_after([{"prompt_token_ids": prompt, "cache_salt": "b"}]) == 0
    hits_after([{"prompt_token_ids": p} for p in other])
    assert hits_after([{"prompt_token_ids": prompt, "cache_salt": "a"}]) == 96
    hits_after([{"prompt_token_ids": p} for p in other])
    assert offload_llm.reset_prefix_cache()
    assert not offload_llm.llm_engine.engine_core.scheduler.connector.slots
    assert hits_after([{"prompt_token_ids": prompt, "cache_salt": "a"}]) == 0


def test_a_small_host_tier_keeps_its_most_recent_blocks(tiny_model_dir, reference):
    """Ten host slots for 56 blocks of prefixes: the LRU turns over, outputs stay the same."""
    llm = make_llm(tiny_model_dir, kv_transfer_config=offload(10, num_staging_blocks=2))
    assert greedy(llm, PROMPTS) == reference[0]
    kv = stats(llm).kv_connector_stats
    assert kv["kv_offload_stored_blocks"] > 10 and kv["external_prefix_cache_hits"] > 0
    assert_pool_whole(llm)


def test_hybrid_model_loads_every_groups_pages(tmp_path):
    """Gemma 3 (two sliding layers, one global: three KV cache groups): each hit loads a page
    of every group."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "models"))
    from family_checkpoints import write_family_checkpoint
    write_family_checkpoint("Gemma3ForCausalLM", tmp_path / "gemma3")
    prompts = PROMPTS[:12]
    expected = greedy(make_llm(tmp_path / "gemma3"), prompts)
    llm = make_llm(tmp_path / "gemma3", kv_transfer_config=offload(256))
    assert greedy(llm, prompts) == expected
    kv, groups = stats(llm).kv_connector_stats, llm.llm_engine.engine_core.scheduler.connector.num_groups
    assert groups == 3 and kv["external_prefix_cache_hits"] > 0
    row = llm.llm_engine.engine_core.model_executor.driver_worker.kv_connector.copier.row_bytes
    assert kv["CPU_to_DEVICE_total_bytes"] == groups * kv["external_prefix_cache_hits"] // 16 * row
    assert_pool_whole(llm)


@pytest.mark.parametrize("engine_kwargs, match", [
    (dict(kv_transfer_config=offload(10**9)), r"kv_connector_extra_config.num_cpu_blocks: 1000000000 host blocks"),
    (dict(kv_transfer_config={**offload(0), "kv_connector_extra_config": {"cpu_bytes_to_use": 2**50}}),
     r"kv_connector_extra_config.cpu_bytes_to_use: \d+ host blocks"),
    (dict(preemption_mode="swap", swap_space=2**20), r"swap_space: \d+ host blocks"),
])
def test_host_pools_past_the_hosts_memory_are_refused_by_name(tiny_model_dir, engine_kwargs, match):
    """A host tier or swap space past 70% of the host's memory fails at start-up, naming its
    setting (np.zeros would reserve it, and the kernel would kill the engine once it filled)."""
    with pytest.raises(ValueError, match=match + r".* GiB of the host's .* GiB, more than 70% of it"):
        make_llm(tiny_model_dir, **engine_kwargs)


def test_a_load_waits_for_the_save_still_staged_into_its_slot():
    """The worker lands a staged save before a later step loads from its slot, after the
    step between them overwrote the device page it came from."""
    spec = KVCacheSpec(4, 0)
    kv_cache_config = KVCacheConfig(8, [KVCacheGroupSpec(["layers.0.self_attn"], spec)])
    config = EngineConfig(kv_transfer=KVTransferConfig("OffloadingConnector", "kv_both",
                                                       {"num_cpu_blocks": 4, "num_staging_blocks": 8}))
    worker = OffloadingConnectorWorker(config, KVConnectorRole.WORKER, kv_cache_config)
    kv = jnp.arange(2 * 2 * 8 * 4 * 3, dtype=jnp.float32).reshape(2, 2, 8, 4, 3)
    worker.register_kv_caches(kv, lambda: None)
    page = np.asarray(kv[:, :, 3])
    worker.bind_connector_metadata(OffloadingConnectorMetadata(saves=[(3, 1)]))
    kv = worker.start_load_kv(kv)
    assert len(worker._staged) == 1  # not landed: nothing waited for it
    kv = kv.at[:, :, 3].set(-1.0)  # the next step writes the evicted page
    worker.bind_connector_metadata(OffloadingConnectorMetadata(loads=[(1, 5)]))
    kv = worker.start_load_kv(kv)
    np.testing.assert_array_equal(np.asarray(kv[:, :, 5]), page)
    assert not worker._staged and worker.stats["CPU_to_DEVICE_total_bytes"] == page.nbytes


@pytest.mark.parametrize("kv_transfer_config, match", [
    ({"kv_connector": "LMCacheConnectorV1"}, "kv_connector must be one of"),
    ({**offload(8), "kv_role": "kv_producer"}, "kv_role must be 'kv_both'"),
    ({**offload(8), "kv_role": "both"}, "kv_role must be one of"),
    ({"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {}}, "exactly one of num_cpu_blocks"),
    (offload(0), r"num_cpu_blocks must be a positive integer"),
    (offload(8, block_size=32), r"block_size must equal the KV cache's block_size \(16\)"),
    (offload(8, num_gpu_blocks=3), r"unknown fields \['num_gpu_blocks'\]"),
    ({**offload(8), "kv_buffer_size": 1}, r"kv_transfer_config has unknown fields \['kv_buffer_size'\]"),
    ('{"kv_connector": ', "kv_transfer_config must be JSON"),
])
def test_bad_kv_transfer_configs_are_refused_by_name(tiny_model_dir, kv_transfer_config, match):
    hf_config = load_hf_config(str(tiny_model_dir))
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=str(tiny_model_dir), block_size=16,
                   kv_transfer_config=kv_transfer_config).create_engine_config(hf_config, "cpu")


@pytest.mark.parametrize("engine_kwargs, match", [
    (dict(enable_prefix_caching=False), "needs enable_prefix_caching=True"),
    (dict(distributed_executor_backend="mp"), "kv_transfer_config needs distributed_executor_backend='uni'"),
])
def test_offloading_needs_the_prefix_cache_and_one_process(tiny_model_dir, engine_kwargs, match):
    hf_config = load_hf_config(str(tiny_model_dir))
    with pytest.raises(ValueError, match=match):
        EngineArgs(model=str(tiny_model_dir), kv_transfer_config=offload(8),
                   **engine_kwargs).create_engine_config(hf_config, "cpu")


def test_cli_flag_takes_vllms_json(tiny_model_dir):
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = engine_args(parser.parse_args(["--kv-transfer-config", json.dumps(offload(64))]))
    config = dataclasses.replace(args, model=str(tiny_model_dir)).create_engine_config(
        load_hf_config(str(tiny_model_dir)), "cpu")
    assert config.kv_transfer == KVTransferConfig("OffloadingConnector", "kv_both", {"num_cpu_blocks": 64})
