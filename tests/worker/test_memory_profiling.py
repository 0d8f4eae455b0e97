"""determine_available_memory by profiling, on a CPU that reports a memory limit the way a
GPU or TPU does: the KV cache gets the limit times hbm_utilization, less the weights held,
less the largest step's peak that XLA reports for its compiled program."""
from __future__ import annotations

import dataclasses
import logging

import jax
import pytest
from flax import nnx

from jaxvllm import platforms
from jaxvllm.config import EngineArgs
from jaxvllm.core.kv_cache_interface import get_kv_cache_config
from jaxvllm.platforms.cpu import CpuPlatform
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.worker.sleep_mode import device_memory_in_use
from jaxvllm.worker.worker import Worker

MiB = 2 ** 20


class MemoryReportingCpu(CpuPlatform):
    """The CPU, with a device memory limit reported as an accelerator's backend reports it."""

    def __init__(self, limit: int):
        self.limit = limit

    def device_memory(self, device) -> tuple[int, int]:
        return self.limit, device_memory_in_use([device])


def worker_under(platform, model_dir, monkeypatch) -> Worker:
    monkeypatch.setattr(platforms, "current_platform", platform)
    hf_config = load_hf_config(str(model_dir))
    config = EngineArgs(model=str(model_dir), skip_warmup=True, max_num_seqs=4, max_num_batched_tokens=64,
                        max_model_len=128, hbm_utilization=0.5).create_engine_config(hf_config, "cpu")
    config = config.replace(cache=dataclasses.replace(config.cache, kv_cache_memory_bytes=None))
    return Worker(config)


def test_kv_cache_budget_is_limit_less_weights_less_peak_step(tiny_model_dir, monkeypatch, caplog):
    platform = MemoryReportingCpu(64 * MiB)
    worker = worker_under(platform, tiny_model_dir, monkeypatch)
    weights = sum(x.nbytes for x in jax.tree.leaves(nnx.state(worker.model)))
    with caplog.at_level(logging.INFO, logger="jaxvllm.worker.worker"):
        available = worker.determine_available_memory()
    num_blocks = get_kv_cache_config(worker.get_kv_cache_spec(), available, max_model_len=128).num_blocks
    profile = worker.memory_profile
    assert profile.limit == 64 * MiB and profile.in_use >= weights
    # The largest forward (64 tokens) and sampler (4 rows of a 256-word vocabulary) hold at least
    # their outputs: 64 hidden states of 64 floats.
    assert 64 * 64 * 4 <= profile.peak_step < 8 * MiB
    assert num_blocks == (32 * MiB - profile.in_use - profile.peak_step) // worker.block_bytes
    assert "GiB peak step" in caplog.text

    platform.limit = 1 * MiB  # less than the weights and a step: refused, with the numbers
    with pytest.raises(ValueError,
                       match=r"The KV cache budget \(-\d+ bytes: .* peak step .*\) holds fewer than 2 blocks"):
        worker.determine_available_memory()


def test_the_offload_connectors_staging_blocks_come_out_of_the_budget(tiny_model_dir, monkeypatch):
    """An OffloadingConnector's staging buffers hold up to num_staging_blocks gathered pages
    beside the pool: the memory plan leaves them."""
    from jaxvllm.config.engine_config import KVTransferConfig
    platform = MemoryReportingCpu(64 * MiB)
    worker = worker_under(platform, tiny_model_dir, monkeypatch)
    in_use = platform.device_memory(worker.device)[1]
    monkeypatch.setattr(platform, "device_memory", lambda device: (64 * MiB, in_use))  # the same both times
    plain = worker.determine_available_memory()
    worker.config = worker.config.replace(kv_transfer=KVTransferConfig(
        "OffloadingConnector", "kv_both", {"num_cpu_blocks": 8, "num_staging_blocks": 5}))
    assert worker.determine_available_memory() == plain - 5 * worker.block_bytes


@pytest.mark.parametrize("kv_cache_memory_bytes", [None, 16 * MiB], ids=["profiled", "kv_cache_memory_bytes"])
def test_a_prefill_engines_held_copies_come_out_of_the_budget(tiny_model_dir, monkeypatch, caplog,
                                                              kv_cache_memory_bytes):
    """A P/D prefill engine keeps each prompt's pages as a device copy until a decode engine
    pulls it: the plan leaves num_send_blocks rows for them (by default two prompts of
    max_model_len, 2 x 8 blocks here), whether the budget was profiled or given; a decode
    engine holds none."""
    from jaxvllm.config.engine_config import KVTransferConfig
    platform = MemoryReportingCpu(64 * MiB)
    worker = worker_under(platform, tiny_model_dir, monkeypatch)
    in_use = platform.device_memory(worker.device)[1]
    monkeypatch.setattr(platform, "device_memory", lambda device: (64 * MiB, in_use))  # the same both times
    worker.config = worker.config.replace(cache=dataclasses.replace(
        worker.config.cache, kv_cache_memory_bytes=kv_cache_memory_bytes))
    plain = worker.determine_available_memory()
    for role, extra, rows in [("kv_producer", {}, 16), ("kv_both", {"num_send_blocks": 5}, 5), ("kv_consumer", {}, 0)]:
        worker.config = worker.config.replace(kv_transfer=KVTransferConfig("JaxTransferConnector", role, extra))
        with caplog.at_level(logging.INFO, logger="jaxvllm.worker.worker"):
            assert worker.determine_available_memory() == plain - rows * worker.block_bytes
        assert not rows or f"({rows} blocks) for the JaxTransferConnector's own device buffers" in caplog.text
