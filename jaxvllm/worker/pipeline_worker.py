"""PipelineWorker: the Worker for pipeline_parallel_size > 1, over one mesh per stage. It
lays the stages out (distributed/pipeline.py), loads each stage's layers onto its mesh
(models/stage_loader.py); the Worker creates each stage's KV cache for its own layers only,
and steps run through the PipelineModelRunner."""
from __future__ import annotations

import dataclasses
import logging

import jax
from jax.sharding import Mesh

from jaxvllm.distributed.pipeline import stage_layer_ranges, stage_meshes
from jaxvllm.models.stage_loader import get_stage_models
from jaxvllm.worker import sleep_mode
from jaxvllm.worker.pipeline_runner import PipelineModelRunner
from jaxvllm.worker.worker import Worker

logger = logging.getLogger(__name__)


class PipelineWorker(Worker):
    def _make_stages(self) -> tuple[list[Mesh], list[range]]:
        p = self.config.parallel
        meshes = stage_meshes(p.pipeline_parallel_size, p.tensor_parallel_size)
        layer_ranges = stage_layer_ranges(self.config.model.hf_config.num_hidden_layers, p.pipeline_parallel_size)
        logger.info("Pipeline stages: layers %s on %d devices each.",
                    ", ".join(f"{r.start}-{r.stop - 1}" for r in layer_ranges), meshes[0].size)
        return meshes, layer_ranges

    def _load_model(self) -> None:
        config, model_path, hf_config = self.config, self.model_path, self.config.model.hf_config
        self.stages = get_stage_models(model_path, hf_config, self.meshes, self.layer_ranges, dtype=config.dtype,
                                       expert_parallel=config.parallel.enable_expert_parallel,
                                       linear_method=self.backend.linear_method, moe_method=self.backend.moe_method,
                                       keep_gguf_blocks=config.quantization == "gguf")
        self.model = self.stages[-1]
        # A KV block spans every layer (each stage holding its own layers' part of it).
        self.args = dataclasses.replace(self.model.args, num_layers=hf_config.num_hidden_layers)

    def determine_available_memory(self) -> int:
        """As the Worker's, except that from device memory each stage offers its own: the
        budget returned is the whole model's equivalent of the tightest stage's (its bytes
        scaled by all layers over its layers), so that one block spans every stage."""
        c = self.config.cache
        if c.kv_cache_memory_bytes is not None:
            return c.kv_cache_memory_bytes
        num_layers = self.args.num_layers
        budgets = []
        for mesh, layers in zip(self.meshes, self.layer_ranges):
            limit, in_use = self._device_memory(mesh.devices.flat[0])
            budgets.append((int(limit * c.hbm_utilization) - in_use) * mesh.size * num_layers // len(layers))
        if min(budgets) < 2 * self.block_bytes:
            raise ValueError("The KV cache budget of a pipeline stage holds fewer than 2 blocks; "
                             "raise hbm_utilization.")
        return min(budgets)

    def _make_runner(self, kv_caches: list[jax.Array], num_swap_blocks: int) -> PipelineModelRunner:
        """num_swap_blocks is always 0 here (EngineConfig.verify refuses swap with stages)."""
        return PipelineModelRunner(self.config, self.stages, kv_caches, self.attends, self.meshes, self.backend)

    # ---- what the Worker does over one mesh, across the stages ----------------------
    def device_memory_in_use(self) -> int:
        return sum(sleep_mode.device_memory_in_use(list(m.local_devices)) for m in self.meshes)

    def sleep(self, level: int = 1) -> None:
        raise ValueError("sleep is not supported with pipeline_parallel_size > 1 yet.")

    def wake_up(self, tags: list[str] | None = None) -> None:
        raise ValueError("wake_up is not supported with pipeline_parallel_size > 1 yet.")

    def update_weights(self, weights) -> None:
        raise ValueError("update_weights is not supported with pipeline_parallel_size > 1 yet.")
