"""Worker: owns the device side of one engine: the device mesh, the model's weights (placed
shard by shard), the KV cache (its specs reported to the engine, which sizes the pool from
them and the memory offered), and the ModelRunner that executes steps. Built from the
EngineConfig alone (vLLM's Worker(vllm_config)): the checkpoint is config.model.path."""
from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from jaxvllm import platforms
from jaxvllm.backends import get_backend
from jaxvllm.config import EngineConfig
from jaxvllm.core.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    block_bytes,
    blocks_per_request,
    describe_groups,
    group_layers,
)
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.distributed.partition import kv_cache_sharding
from jaxvllm.kv_transfer.base import KVConnectorRole
from jaxvllm.kv_transfer.factory import KVConnectorFactory
from jaxvllm.models.loader import load_weights
from jaxvllm.models.model_loader import get_model
from jaxvllm.models.weight_update import WeightUpdater
from jaxvllm.outputs import KVConnectorOutput, ModelRunnerOutput
from jaxvllm.platforms.huge_pages import advise_huge_pages, huge_page_ranges, run_at_idle_priority
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.orbax_checkpoint import is_orbax_checkpoint
from jaxvllm.worker import sleep_mode
from jaxvllm.worker.async_output import AsyncModelRunnerOutput
from jaxvllm.worker.memory_profiling import MemoryProfile, peak_step_bytes, profile_num_blocks
from jaxvllm.worker.model_runner import ModelRunner
from jaxvllm.worker.pooling_runner import PoolingModelRunner
from jaxvllm.worker.spec_decode.draft_model import DRAFT_PREFIX
from jaxvllm.worker.spec_decode.spec_runner import runner_class

logger = logging.getLogger(__name__)
SLEEP_TAGS = ("weights", "kv_cache")  # what sleep frees and wake_up(tags) restores (vLLM's)


def enable_compilation_cache() -> None:
    """Keep compiled programs on disk across runs (JAXVLLM_XLA_CACHE, empty to disable),
    so a second start-up loads its buckets instead of compiling them. Every program, however
    quick to compile: the start-up's small ones (KV cache zeros, weight packing, penalty rows)
    took ~0.5 s to compile again on each start."""
    path = os.environ.get("JAXVLLM_XLA_CACHE", os.path.expanduser("~/.cache/jaxvllm/xla"))
    if path and jax.config.jax_compilation_cache_dir is None:
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


@dataclass
class WithConnectorOutput:
    """A dispatched step and its KV connector's report, which rides on its ModelRunnerOutput."""
    step: AsyncModelRunnerOutput
    kv_connector_output: KVConnectorOutput

    def get_output(self) -> ModelRunnerOutput:
        output = self.step.get_output()
        output.kv_connector_output = self.kv_connector_output
        return output


class Worker:
    """One engine's devices, as stages: one stage (all layers on one mesh) here; the
    PipelineWorker's stages split the layers over several meshes (the hooks _make_stages,
    _load_model and _make_runner)."""

    draft_model: nnx.Module | None = None  # speculative decoding's draft model or EAGLE-3 head
    kv_connector = None  # a KV connector's worker side (kv_transfer_config)

    def __init__(self, config: EngineConfig):
        self.config = config
        enable_compilation_cache()
        self.model_path = config.model.path
        self.dtype = jnp.dtype(config.dtype)
        # The kernels and methods every step runs with, chosen here once.
        self.backend = get_backend(config, platforms.current_platform)
        self.meshes, self.layer_ranges = self._make_stages()
        self.mesh = self.meshes[0]
        self.device = self.mesh.devices.flat[0]
        self._load_model()
        self.kv_dtype = self.backend.kv_dtype
        self.attends = [self.backend.attention(m) for m in self.meshes]
        self.attend = self.attends[-1]
        self.memory_profile: MemoryProfile | None = None  # where the device reports its memory
        self.sleeping_tags: set[str] = set()
        self._host_weights = None  # sleep level 1's copy of the weights
        self._huge_pages_stop = threading.Event()  # set when the collapsed buffers go

    def _make_stages(self) -> tuple[list[Mesh], list[range]]:
        hf_config = self.config.model.hf_config
        return [make_mesh(self.config.parallel.tensor_parallel_size)], [range(hf_config.num_hidden_layers)]

    def _load_model(self) -> None:
        config, model_path, hf_config, backend = self.config, self.model_path, self.config.model.hf_config, self.backend
        # Read here so that update_weights knows the checkpoint's names and shapes.
        weights = None if is_orbax_checkpoint(model_path) else load_weights(model_path, config.quantization == "gguf")
        self.model = get_model(model_path, hf_config, self.mesh, dtype=config.dtype, weights=weights,
                               expert_parallel=config.parallel.enable_expert_parallel,
                               linear_method=backend.linear_method, moe_method=backend.moe_method)
        self.weight_updater = WeightUpdater(self.model, self.mesh, hf_config,
                                            weights and {name: w.shape for name, w in weights.items()},
                                            expert_parallel=config.parallel.enable_expert_parallel)
        del weights
        self.args = self.model.args
        spec = config.speculative
        if spec is not None and spec.method in ("draft_model", "eagle3"):
            # Unquantized, on the same mesh, its experts (if any) split by tensor parallelism.
            draft_weights = None if is_orbax_checkpoint(spec.model) else load_weights(spec.model)
            if spec.method == "eagle3" and draft_weights is not None and not {
                    "embed_tokens.weight", "model.embed_tokens.weight"} & draft_weights.keys():
                # An EAGLE-3 head without its own embedding shares the target's (as vLLM does).
                draft_weights["model.embed_tokens.weight"] = np.asarray(self.model.embed_tokens.get_value())
            self.draft_model = get_model(spec.model, load_hf_config(spec.model), self.mesh, dtype=config.dtype,
                                         weights=draft_weights, linear_method=backend.float_linear_method,
                                         moe_method=backend.float_moe_method)

    # ---- the KV cache: specs, memory, allocation (engine/engine_core.py sizes it) ------
    def _kv_cache_shape(self, num_layers: int, num_blocks: int, args=None) -> tuple[int, ...]:
        a = args or self.args
        return self.backend.kv_cache_shape(num_layers, num_blocks, self.config.cache.block_size,
                                           a.num_kv_heads, a.head_dim)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """Every attention layer's pages (vLLM's get_kv_cache_spec): a sliding layer's spec
        carries its window (the scheduler keeps only that much of it), unless the window
        spans max_model_len anyway, or the layers are split into pipeline stages (each
        stage's cache holds its own layers: they keep every page), or
        disable_hybrid_kv_cache_manager asks for the old way."""
        page = math.prod(self._kv_cache_shape(1, 1)) * self.kv_dtype.storage.itemsize
        bs, max_len = self.config.cache.block_size, self.config.scheduler.max_model_len
        windows = (self.model.sliding_windows() if len(self.layer_ranges) == 1
                   and not self.config.scheduler.disable_hybrid_kv_cache_manager else [None] * self.args.num_layers)
        specs = {f"layers.{i}.self_attn": KVCacheSpec(bs, page, w if w is not None and w < max_len else None)
                 for layers in self.layer_ranges for i in layers for w in [windows[i]]}
        if self.draft_model is not None:  # its layers share the target's blocks (spec_decode/draft_model.py)
            if self._kv_cache_shape(1, 1, self.draft_model.args) != self._kv_cache_shape(1, 1):
                a, d = self.args, self.draft_model.args
                raise ValueError(
                    f"speculative_config.model has {d.num_kv_heads} KV heads of {d.head_dim}, the target "
                    f"{a.num_kv_heads} of {a.head_dim}: a draft model's KV shares the target's pages and needs "
                    "the same KV heads and head size.")
            windows = (self.draft_model.sliding_windows() if not self.config.scheduler.disable_hybrid_kv_cache_manager
                       else [None] * self.draft_model.args.num_layers)
            specs.update({f"{DRAFT_PREFIX}layers.{i}.self_attn": KVCacheSpec(bs, page, w if w is not None
                                                                             and w < max_len else None)
                          for i, w in enumerate(windows)})
        return specs

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block over all layers and the whole mesh."""
        return block_bytes(group_layers(self.get_kv_cache_spec()))

    def determine_available_memory(self) -> int:
        """KV cache bytes over the mesh: kv_cache_memory_bytes, else the device's memory
        less the weights and the largest step's peak (worker/memory_profiling.py); either way
        less what a KV connector holds beside the pool (staging, P/D copies awaiting a pull)."""
        c, gib = self.config.cache, 2**30
        if c.kv_cache_memory_bytes is not None:
            budget, how = c.kv_cache_memory_bytes, f"{c.kv_cache_memory_bytes / gib:.2f} GiB (kv_cache_memory_bytes)"
        else:
            memory = self._device_memory(self.device)
            free = int(memory[0] * c.hbm_utilization) - memory[1]
            self.memory_profile = MemoryProfile(*memory, peak_step=self._peak_step_bytes(free))
            budget = self.memory_profile.kv_cache_budget(c.hbm_utilization, self.mesh.size)
            how = self.memory_profile.describe(c.hbm_utilization, self.mesh.size)
        if self.config.kv_transfer is not None:
            connector = KVConnectorFactory.get_connector_class(self.config, KVConnectorRole.WORKER)
            reserved = connector.reserved_device_bytes(self.config, self.block_bytes)
            if reserved:
                budget -= reserved
                how += (f"; of it {reserved / gib:.2f} GiB ({reserved // self.block_bytes} blocks) for the "
                        f"{self.config.kv_transfer.kv_connector}'s own device buffers, {budget / gib:.2f} GiB "
                        f"for the pool")
        logger.info("KV cache budget: %s.", how)
        if budget < 2 * self.block_bytes:
            raise ValueError(f"The KV cache budget ({budget} bytes: {how}) holds fewer than 2 blocks of "
                             f"{self.block_bytes} bytes; raise kv_cache_memory_bytes or hbm_utilization.")
        return budget

    def _device_memory(self, device) -> tuple[int, int]:
        platform = self.backend.platform
        memory = platform.device_memory(device)
        if memory is None:
            raise ValueError(f"The {platform.device_name} backend does not report its memory; "
                             "set kv_cache_memory_bytes or num_gpu_blocks_override.")
        return memory

    def _peak_step_bytes(self, free_bytes: int) -> int:
        """The largest step's memory beyond its arguments, from its programs compiled for an
        abstract KV cache (memory_profiling.profile_num_blocks: one request's, or on a TPU at
        least 1 GiB per device where free_bytes, per device, hold it)."""
        draft = {} if self.draft_model is None else {"draft_model": self.draft_model}
        slots = self.args.num_layers + (self.draft_model.args.num_layers if draft else 0)
        pages = -(-self.config.scheduler.max_model_len // self.config.cache.block_size)
        block_bytes = math.prod(self._kv_cache_shape(slots, 1)) * self.kv_dtype.storage.itemsize // self.mesh.size
        blocks = profile_num_blocks(self.backend.platform, pages, block_bytes, free_bytes)
        layout = self.backend.platform.kv_cache_layout
        kv_cache = jax.ShapeDtypeStruct(self._kv_cache_shape(slots, blocks), self.kv_dtype.storage,
                                        sharding=kv_cache_sharding(self.mesh, layout))
        return peak_step_bytes(runner_class(self.config)(self.config, self.model, kv_cache, self.attend,
                                                         mesh=self.mesh, backend=self.backend, **draft))

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> ModelRunner:
        """Allocate the pool the engine chose (each stage its layers' part of every block),
        then build and warm the runner."""
        num_blocks, bs = kv_cache_config.num_blocks, self.config.cache.block_size
        self.kv_cache_config = kv_cache_config
        # One stage: a slot per layer of a group; stages hold their own layers (one group).
        slots = [kv_cache_config.num_slots] if len(self.layer_ranges) == 1 else map(len, self.layer_ranges)
        # Created in place, each device allocating only its KV heads; kept to create them
        # again at wake-up without compiling.
        layout = self.backend.platform.kv_cache_layout
        self._new_kv_caches = [jax.jit(lambda shape=self._kv_cache_shape(n, num_blocks):  # noqa: B008
                                       jnp.zeros(shape, self.kv_dtype.storage),
                                       out_shardings=kv_cache_sharding(mesh, layout))
                               for mesh, n in zip(self.meshes, slots)]
        kv_caches = [new() for new in self._new_kv_caches]
        weights = sum(s.data.nbytes for x in jax.tree.leaves(nnx.state(self.model))
                      for s in x.addressable_shards if s.device == self.device)
        logger.info("Memory plan per device: weights %.1f MiB (quantization=%s), KV cache %.1f MiB of %s: "
                    "%d blocks of %d tokens, %d bytes each.", weights / 2**20, self.config.quantization,
                    sum(c.nbytes for c in kv_caches) / self.mesh.size / 2**20, self.config.cache.kv_cache_dtype,
                    num_blocks, bs, kv_cache_config.block_bytes // self.mesh.size)
        logger.info("KV cache groups (a block is a page of %d layers): %s; a request of max_model_len "
                    "(%d) holds at most %d blocks.", kv_cache_config.num_slots,
                    describe_groups(kv_cache_config.kv_cache_groups), self.config.scheduler.max_model_len,
                    blocks_per_request(kv_cache_config.kv_cache_groups, self.config.scheduler.max_model_len))
        if kv_cache_config.num_swap_blocks:
            logger.info("Swap space: %d host blocks (%.1f MiB).", kv_cache_config.num_swap_blocks,
                        kv_cache_config.num_swap_blocks * kv_cache_config.block_bytes / 2**20)
        runner = self._make_runner(kv_caches, kv_cache_config.num_swap_blocks)
        if self.config.kv_transfer is not None:  # its worker side (kv_transfer)
            self.kv_connector = KVConnectorFactory.create_connector(self.config, KVConnectorRole.WORKER,
                                                                    kv_cache_config)
            self.kv_connector.register_kv_caches(runner.kv_cache, runner._count_compilation)
        if not self.config.compilation.skip_warmup:
            if self.kv_connector is not None:
                runner.kv_cache = self.kv_connector.warmup(runner.kv_cache)
            runner.warmup()
        if self.backend.platform.huge_pages:
            # Collapsing takes seconds of CPU per GiB (platforms/huge_pages.py): in the background
            # at idle priority, and only once the first step is done, since beside that step it
            # delayed a warm start's first token by ~0.8 s.
            ranges = huge_page_ranges((runner.params, runner.kv_cache))
            runner.after_first_step = threading.Thread(
                target=self._advise_huge_pages, args=(ranges, self._huge_pages_stop), name="huge-pages",
                daemon=True).start
        self.model_runner = runner
        return runner

    def _make_runner(self, kv_caches: list[jax.Array], num_swap_blocks: int) -> ModelRunner:
        runner_cls = PoolingModelRunner if self.config.model.runner == "pooling" else runner_class(self.config)
        draft = {} if self.draft_model is None else {"draft_model": self.draft_model}
        return runner_cls(self.config, self.model, kv_caches[0], self.attend, num_swap_blocks,
                          mesh=self.mesh, backend=self.backend,
                          kv_cache_groups=self.kv_cache_config.kv_cache_groups, **draft)

    @staticmethod
    def _advise_huge_pages(ranges, stop: threading.Event) -> None:
        run_at_idle_priority()
        collapsed = advise_huge_pages(ranges, stop)
        logger.debug("Huge pages: %.0f MiB of weights and KV cache.", collapsed / 2**20)

    # ---- what an executor calls (in process, or by collective_rpc in a worker process) ----
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        if self.kv_connector is None:
            return self.model_runner.execute_model(scheduler_output)
        return self.execute_model_async(scheduler_output).get_output()

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        connector, runner = self.kv_connector, self.model_runner
        if connector is None:
            return runner.execute_model_async(scheduler_output)
        # Before the runner's swap copies: a step that loads admits requests, and a step that
        # swaps out preempted and admits nobody, so the two never touch the same pages.
        connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)
        runner.kv_cache = connector.start_load_kv(runner.kv_cache)
        output = runner.execute_model_async(scheduler_output)
        connector.wait_for_save(runner.kv_cache)
        sending, recving = connector.get_finished(scheduler_output.finished_req_ids)
        connector.clear_connector_metadata()
        return WithConnectorOutput(output, KVConnectorOutput(sending, recving, connector.get_kv_connector_stats(),
                                                             connector.get_block_ids_with_load_errors()))

    def get_num_compilations(self) -> int:
        return self.model_runner.num_compilations

    def device_memory_in_use(self) -> int:
        return sleep_mode.device_memory_in_use(list(self.mesh.local_devices))

    def shutdown(self) -> None:
        """Stop collapsing buffers the engine is about to drop, and the connector's threads."""
        self._huge_pages_stop.set()
        if self.kv_connector is not None:
            self.kv_connector.shutdown()

    # ---- sleep mode and weight updates (vLLM's Worker.sleep, wake_up, update_weights) ----
    def sleep(self, level: int = 1) -> None:
        """Level 1: the weights to host memory, the KV cache freed; level 2: both freed (the
        weights come back from update_weights or, at wake-up, from the checkpoint). The
        compiled programs stay."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}.")
        runner = self.model_runner
        runner.after_first_step = None  # its huge-page ranges are about to be freed
        self._huge_pages_stop.set()
        if "weights" not in self.sleeping_tags:
            self._host_weights = sleep_mode.offload(runner.params) if level == 1 else None
            sleep_mode.free(runner.params)
            self.sleeping_tags.add("weights")
        elif level == 2:
            self._host_weights = None
        if "kv_cache" not in self.sleeping_tags:
            sleep_mode.free(runner.kv_cache)
            runner.kv_cache = None
            self.sleeping_tags.add("kv_cache")
        sleep_mode.release_host_memory()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what `tags` names (default: both) that is asleep; the rest of a partial
        wake-up stays asleep. The KV cache comes back zeroed (its prefixes were forgotten)."""
        tags = list(SLEEP_TAGS) if tags is None else tags
        if unknown := sorted(set(tags) - set(SLEEP_TAGS)):
            raise ValueError(f"wake_up tags must be among {list(SLEEP_TAGS)}, got {unknown}.")
        if "weights" in tags and "weights" in self.sleeping_tags:
            if self._host_weights is not None:
                self._set_params(sleep_mode.restore(self._host_weights))
            else:  # level 2: the checkpoint the engine started from
                self._load(self.weight_updater.prepare(self.model_path))
            self._host_weights = None
            self.sleeping_tags.discard("weights")
        if "kv_cache" in tags and "kv_cache" in self.sleeping_tags:
            self.model_runner.kv_cache = self._new_kv_caches[0]()
            self.sleeping_tags.discard("kv_cache")
        sleep_mode.release_host_memory()  # the host copy of the weights, freed

    def update_weights(self, weights) -> None:
        """New weights from {name: array} or a path (models/weight_update.py), all validated
        and placed before any weight changes. Asleep, the weights wake with the update (after
        level 2 the update must hold every weight); the KV cache stays as it is."""
        pairs = self.weight_updater.prepare(weights)
        if "weights" in self.sleeping_tags:
            if self._host_weights is None and (missing := self.weight_updater.missing(n for n, _ in pairs)):
                raise ValueError(f"update_weights after sleep(level=2) needs every weight: "
                                 f"{len(missing)} missing, e.g. {missing[0]!r}.")
            if self._host_weights is not None:
                self._set_params(sleep_mode.restore(self._host_weights))
            self._host_weights = None
            self.sleeping_tags.discard("weights")
        self._load(pairs)

    def _load(self, pairs) -> None:
        """The loader's own path: each linear method stores its weights its way again."""
        self.model.load_weights(pairs)
        self._set_params(nnx.state(self.model))

    def _set_params(self, params) -> None:
        nnx.update(self.model, params)
        self.model_runner.params = nnx.split(self.model)[1]
