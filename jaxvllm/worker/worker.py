"""Worker: owns the device side of one engine: the device mesh, the model's weights (placed
shard by shard), the KV cache sized from a memory budget, and the ModelRunner that executes
steps."""
from __future__ import annotations

import logging
import math
import os
import threading

import jax
import jax.numpy as jnp
from flax import nnx

from jaxvllm import platforms
from jaxvllm.config import EngineConfig
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.distributed.partition import kv_cache_sharding
from jaxvllm.layers.attention import get_attention
from jaxvllm.layers.kv_cache_dtype import kv_cache_dtype
from jaxvllm.models.model_loader import get_model
from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.platforms.huge_pages import advise_huge_pages, huge_page_ranges
from jaxvllm.worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def enable_compilation_cache() -> None:
    """Keep compiled programs on disk across runs (JAXVLLM_XLA_CACHE, empty to disable),
    so a second start-up loads its buckets instead of compiling them. Every program, however
    quick to compile: the start-up's small ones (KV cache zeros, weight packing, penalty rows)
    took ~0.5 s to compile again on each start."""
    path = os.environ.get("JAXVLLM_XLA_CACHE", os.path.expanduser("~/.cache/jaxvllm/xla"))
    if path and jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


class Worker:
    def __init__(self, config: EngineConfig, model_path: str, hf_config):
        self.config = config
        enable_compilation_cache()
        tp = config.parallel.tensor_parallel_size
        self.mesh = make_mesh(tp)
        self.device = self.mesh.devices.flat[0]
        self.dtype = jnp.dtype(config.dtype)
        platform = platforms.current_platform
        method = platform.linear_method(config.attention_backend, self.mesh.size, config.quantization)
        self.model = get_model(config, model_path, hf_config, self.mesh, linear_method=method,
                               moe_method=platform.fused_moe_method())
        self.args = self.model.args
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, platform.kv_cache_fp8_as_bits)
        self.attend = get_attention(config.attention_backend, platform, self.mesh, self.kv_dtype)

    @property
    def kv_cache_shape_per_block(self) -> tuple[int, ...]:
        a = self.args
        return (a.num_layers, 2, self.config.cache.block_size, a.num_kv_heads, a.head_dim)

    @property
    def block_bytes(self) -> int:
        return math.prod(self.kv_cache_shape_per_block) * self.kv_dtype.storage.itemsize

    def determine_num_blocks(self) -> int:
        """From num_gpu_blocks_override, else kv_cache_memory_bytes, else the fraction
        `hbm_utilization` of the device memory that the backend reports."""
        c = self.config.cache
        if c.num_gpu_blocks_override is not None:
            return c.num_gpu_blocks_override
        block_bytes = self.block_bytes
        if c.kv_cache_memory_bytes is not None:
            budget = c.kv_cache_memory_bytes
        else:
            platform = platforms.current_platform
            memory = platform.device_memory(self.device)
            if memory is None:
                raise ValueError(f"The {platform.device_name} backend does not report its memory; "
                                 "set kv_cache_memory_bytes or num_gpu_blocks_override.")
            # Every device of the mesh holds 1/size of each block (its KV heads).
            limit, in_use = memory
            budget = (int(limit * c.hbm_utilization) - in_use) * self.mesh.size
        num_blocks = budget // block_bytes
        weights = sum(s.data.nbytes for x in jax.tree.leaves(nnx.state(self.model))
                      for s in x.addressable_shards if s.device == self.device)
        logger.info("Memory plan per device: weights %.1f MiB (quantization=%s), KV cache %.1f MiB of %s "
                    "in blocks of %d bytes: %d blocks.", weights / 2**20, self.config.quantization,
                    budget / self.mesh.size / 2**20, self.config.kv_cache_dtype,
                    block_bytes // self.mesh.size, num_blocks)
        if num_blocks < 2:
            raise ValueError(f"The KV cache budget ({budget} bytes) holds fewer than 2 blocks of "
                             f"{block_bytes} bytes; raise kv_cache_memory_bytes or hbm_utilization.")
        return num_blocks

    def initialize_cache(self, num_blocks: int, num_swap_blocks: int = 0) -> ModelRunner:
        a, bs = self.args, self.config.cache.block_size
        shape = (a.num_layers, 2, num_blocks, bs, a.num_kv_heads, a.head_dim)
        # Created in place, each device allocating only its KV heads.
        kv_cache = jax.jit(lambda: jnp.zeros(shape, self.kv_dtype.storage),
                           out_shardings=kv_cache_sharding(self.mesh))()
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB).", num_blocks, bs,
                    kv_cache.nbytes / 2**20)
        if num_swap_blocks:
            logger.info("Swap space: %d host blocks (%.1f MiB).", num_swap_blocks,
                        num_swap_blocks * self.block_bytes / 2**20)
        runner = ModelRunner(self.config, self.model, kv_cache, self.attend, num_swap_blocks,
                             mesh=self.mesh, platform=platforms.current_platform)
        if not self.config.skip_warmup:
            runner.warmup()
        if platforms.current_platform.huge_pages:
            # Collapsing ~1 GiB keeps a core (and the page tables) busy for a second or more: in
            # the background, and only once the first step is done, since beside that step it
            # delayed a warm start's first token by ~0.8 s.
            ranges = huge_page_ranges((runner.params, runner.kv_cache))
            runner.after_first_step = threading.Thread(
                target=self._advise_huge_pages, args=(ranges,), name="huge-pages", daemon=True).start
        self.model_runner = runner
        return runner

    @staticmethod
    def _advise_huge_pages(ranges) -> None:
        collapsed = advise_huge_pages(ranges)
        logger.debug("Huge pages: %.0f MiB of weights and KV cache.", collapsed / 2**20)

    # ---- what an executor calls (in process, or by collective_rpc in a worker process) ----
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def get_num_compilations(self) -> int:
        return self.model_runner.num_compilations
