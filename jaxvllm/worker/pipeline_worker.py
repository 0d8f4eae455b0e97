"""PipelineWorker: the Worker for pipeline_parallel_size > 1. It lays the stages out
(distributed/pipeline.py), loads each stage's layers onto its mesh (models/stage_loader.py),
creates each stage's KV cache for its own layers only, and runs steps through the
PipelineModelRunner."""
from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp

from jaxvllm import platforms
from jaxvllm.config import EngineConfig
from jaxvllm.distributed.partition import kv_cache_sharding
from jaxvllm.distributed.pipeline import stage_layer_ranges, stage_meshes
from jaxvllm.layers.attention import get_attention
from jaxvllm.layers.kv_cache_dtype import kv_cache_dtype
from jaxvllm.models.stage_loader import get_stage_models
from jaxvllm.worker import sleep_mode
from jaxvllm.worker.pipeline_runner import PipelineModelRunner
from jaxvllm.worker.worker import Worker, enable_compilation_cache

logger = logging.getLogger(__name__)


class PipelineWorker(Worker):
    def __init__(self, config: EngineConfig, model_path: str, hf_config):
        self.config = config
        enable_compilation_cache()
        p = config.parallel
        self.meshes = stage_meshes(p.pipeline_parallel_size, p.tensor_parallel_size)
        self.layer_ranges = stage_layer_ranges(hf_config.num_hidden_layers, p.pipeline_parallel_size)
        self.mesh = self.meshes[0]
        self.device = self.mesh.devices.flat[0]
        self.dtype = jnp.dtype(config.dtype)
        platform = platforms.current_platform
        self.stages = get_stage_models(
            config, model_path, hf_config, self.meshes, self.layer_ranges,
            [platform.linear_method(config.attention_backend, m.size, config.quantization) for m in self.meshes],
            platform.fused_moe_method(config.quantization))
        self.model = self.stages[-1]
        # A KV block spans every layer (each stage holding its own layers' part of it).
        self.args = dataclasses.replace(self.model.args, num_layers=hf_config.num_hidden_layers)
        self.kv_dtype = kv_cache_dtype(config.kv_cache_dtype, self.dtype, platform.kv_cache_fp8_as_bits)
        self.attends = [get_attention(config.attention_backend, platform, m, self.kv_dtype) for m in self.meshes]
        self.memory_profile = None  # the Worker's profile of one mesh; stages size their own
        logger.info("Pipeline stages: layers %s on %d devices each.",
                    ", ".join(f"{r.start}-{r.stop - 1}" for r in self.layer_ranges), self.mesh.size)

    def determine_num_blocks(self) -> int:
        """As the Worker's, except that from device memory the budget is that of the stage
        with the most layers per device."""
        c = self.config.cache
        if c.num_gpu_blocks_override is not None or c.kv_cache_memory_bytes is not None:
            return super().determine_num_blocks()
        platform = platforms.current_platform
        layer_bytes = self.block_bytes // self.args.num_layers
        counts = []
        for mesh, layers in zip(self.meshes, self.layer_ranges):
            memory = platform.device_memory(mesh.devices.flat[0])
            if memory is None:
                raise ValueError(f"The {platform.device_name} backend does not report its memory; "
                                 "set kv_cache_memory_bytes or num_gpu_blocks_override.")
            limit, in_use = memory
            budget = (int(limit * c.hbm_utilization) - in_use) * mesh.size
            counts.append(budget // (layer_bytes * len(layers)))
        if min(counts) < 2:
            raise ValueError("The KV cache budget of a pipeline stage holds fewer than 2 blocks; "
                             "raise hbm_utilization.")
        return min(counts)

    def initialize_cache(self, num_blocks: int, num_swap_blocks: int = 0) -> PipelineModelRunner:
        """num_swap_blocks is always 0 here (EngineConfig.verify refuses swap with stages)."""
        a, bs = self.args, self.config.cache.block_size
        caches = []
        for mesh, layers in zip(self.meshes, self.layer_ranges):
            shape = platforms.current_platform.kv_cache_shape(len(layers), num_blocks, bs, a.num_kv_heads,
                                                              a.head_dim)
            caches.append(jax.jit(lambda shape=shape: jnp.zeros(shape, self.kv_dtype.storage),
                                  out_shardings=kv_cache_sharding(mesh))())
        logger.info("KV cache: %d blocks of %d tokens (%.1f MiB over %d stages).", num_blocks, bs,
                    sum(c.nbytes for c in caches) / 2**20, len(caches))
        runner = PipelineModelRunner(self.config, self.stages, caches, self.attends, self.meshes,
                                     platforms.current_platform)
        if not self.config.skip_warmup:
            runner.warmup()
        self.model_runner = runner
        return runner

    # ---- what the Worker does over one mesh, across the stages ----------------------
    def device_memory_in_use(self) -> int:
        return sum(sleep_mode.device_memory_in_use(list(m.local_devices)) for m in self.meshes)

    def sleep(self, level: int = 1) -> None:
        raise ValueError("sleep is not supported with pipeline_parallel_size > 1 yet.")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise ValueError("wake_up is not supported with pipeline_parallel_size > 1 yet.")

    def update_weights(self, weights) -> None:
        raise ValueError("update_weights is not supported with pipeline_parallel_size > 1 yet.")
