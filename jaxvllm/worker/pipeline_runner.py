"""Pipeline parallelism's step: the forward runs as one compiled program per stage, each on
its own mesh with its own layers and KV cache (the cache of a stage holds only its layers);
the hidden states pass from stage to stage on device (`jax.device_put` between meshes).

One batch is in the pipeline at a time: the host dispatches the stages' programs back to
back without waiting (JAX's dispatch is asynchronous), but the next batch is scheduled only
once this one's tokens are sampled, so while one stage computes the others wait. vLLM's
virtual engines (P batches in flight) are not built.

Everything after the forward (sampler, penalties, logprobs) runs on the last stage's mesh,
which holds the final norm and the LM head: that is ModelRunner's, unchanged.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxvllm.config import EngineConfig
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.platforms import Platform
from jaxvllm.worker.compiled_programs import CompiledProgram, fingerprint
from jaxvllm.worker.model_runner import ModelRunner


class PipelineForward:
    """Called as ModelRunner's forward program is: (params, kv_caches, input_ids, md,
    logits_indices) -> (hidden[logits_indices], hidden, kv_caches), where kv_caches holds
    one cache per stage. `params` is the last stage's (the sampler's); each stage's own are
    held here."""

    def __init__(self, config: EngineConfig, stages: list[nnx.Module], kv_caches: list[jax.Array],
                 attends: list, meshes: list[Mesh], platform: Platform, count_compilation,
                 directory: str | None):
        self.params, self.programs, self.replicated = [], [], []
        last = len(stages) - 1
        for s, (model, kv_cache, attend, mesh) in enumerate(zip(stages, kv_caches, attends, meshes)):
            graphdef, params = nnx.split(model)

            def stage(params, kv_cache, x, md, logits_indices, graphdef=graphdef, attend=attend,
                      mesh=mesh, first=s == 0, is_last=s == last):
                count_compilation()  # runs at trace time: one trace is one compilation
                with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                    model = nnx.merge(graphdef, params)
                    h = model.embed(x) if first else x
                    h, kv_cache = model.forward_layers(h, kv_cache, md, attend, platform.layer_loop)
                    if not is_last:
                        return h, kv_cache
                    h = model.final_norm(h)
                    return h[logits_indices], h, kv_cache

            rep = NamedSharding(mesh, P())
            outs = (rep, rep, kv_cache.sharding) if s == last else (rep, kv_cache.sharding)
            jitted = jax.jit(stage, donate_argnums=(1,), out_shardings=outs, in_shardings=(
                jax.tree.map(lambda x: x.sharding, params), kv_cache.sharding, rep, rep, rep))
            key = fingerprint(config, model.args, mesh.devices.shape, s)
            self.programs.append(CompiledProgram(f"forward_stage{s}", stage, jitted, key, directory,
                                                 list(mesh.devices.flat), (0, 1)))
            self.params.append(params)
            self.replicated.append(rep)

    def __call__(self, params, kv_caches, input_ids, md, logits_indices):
        x, caches = input_ids, list(kv_caches)
        for s, program in enumerate(self.programs[:-1]):
            x, caches[s] = program(self.params[s], caches[s], x, md, logits_indices)
            x = jax.device_put(x, self.replicated[s + 1])  # device to device, to the next stage
        selected, hidden, caches[-1] = self.programs[-1](self.params[-1], caches[-1], x, md,
                                                         logits_indices)
        return selected, hidden, tuple(caches)

    def warmup_jobs(self, kv_caches, T: int, md: AttentionMetadata, logits_indices, hidden_size: int,
                    dtype) -> list[tuple[CompiledProgram, tuple, dict]]:
        """Every stage's program for token bucket T (later stages take hidden states)."""
        jobs = []
        for s, program in enumerate(self.programs):
            x = (np.zeros(T, np.int32) if s == 0 else
                 jax.ShapeDtypeStruct((T, hidden_size), dtype, sharding=self.replicated[s]))
            jobs.append((program, (self.params[s], kv_caches[s], x, md, logits_indices), {}))
        return jobs


class PipelineModelRunner(ModelRunner):
    """ModelRunner with the forward split into stages; the last stage's model and mesh are
    the sampler's."""

    def __init__(self, config: EngineConfig, stages: list[nnx.Module], kv_caches: list[jax.Array],
                 attends: list, meshes: list[Mesh], platform: Platform):
        super().__init__(config, stages[-1], kv_caches[-1], attends[-1], mesh=meshes[-1],
                         platform=platform)
        self.kv_cache = tuple(kv_caches)
        self._forward = PipelineForward(config, stages, kv_caches, attends, meshes, platform,
                                        self._count_compilation, self._executables_dir)

    @property
    def programs(self) -> tuple[CompiledProgram, ...]:
        return (*self._forward.programs, self._prompt_logprobs, self._sample, self._sample_extended,
                self._set_row)

    def warmup_jobs(self) -> list[tuple[CompiledProgram, tuple, dict]]:
        jobs = []
        for program, args, static in super().warmup_jobs():
            if program is self._forward:
                _, _, input_ids, md, logits_indices = args
                jobs += self._forward.warmup_jobs(self.kv_cache, len(input_ids), md, logits_indices,
                                                  self.hidden_size, self.hidden_dtype)
            else:
                jobs.append((program, args, static))
        return jobs
