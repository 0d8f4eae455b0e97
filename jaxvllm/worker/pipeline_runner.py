"""Pipeline parallelism's step: the forward runs as one compiled program per stage, each on
its own mesh with its own layers and KV cache (the cache of a stage holds only its layers);
the hidden states pass from stage to stage on device (`jax.device_put` between meshes).

The host dispatches the stages' programs back to back without waiting (JAX's dispatch is
asynchronous), and the engine's batch queue (engine/batch_queue.py) dispatches the next
batch before this one's tokens are read, so that the stages compute different batches at
once. Nothing of a batch may wait on the batch before: the first stage reads the last
sampler's tokens only where a token is really in flight (never with the batch queue, which
schedules a request again only once its tokens are back).

Everything after the forward (sampler, penalties, logprobs) runs on the last stage's mesh,
which holds the final norm and the LM head: that is ModelRunner's, unchanged.
"""
from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxvllm.backends import Backend
from jaxvllm.config import EngineConfig
from jaxvllm.layers.attention import AttentionMetadata, in_kv_cache_groups
from jaxvllm.worker.compiled_programs import CompiledProgram, fingerprint
from jaxvllm.worker.model_runner import ModelRunner, with_tokens_in_flight


class PipelineForward:
    """Called as ModelRunner's forward program is: (params, kv_caches, input_ids, prev_rows,
    last_sampled, md, logits_indices) -> (hidden[logits_indices], hidden, kv_caches), where kv_caches holds
    one cache per stage. `params` is the last stage's (the sampler's); each stage's own are
    held here."""

    def __init__(self, config: EngineConfig, stages: list[nnx.Module], kv_caches: list[jax.Array],
                 attends: list, meshes: list[Mesh], backend: Backend, count_compilation,
                 directory: str | None):
        self.params, self.programs, self.replicated = [], [], []
        self.max_num_seqs = config.scheduler.max_num_seqs
        last = len(stages) - 1
        for s, (model, kv_cache, attend, mesh) in enumerate(zip(stages, kv_caches, attends, meshes)):
            graphdef, params = nnx.split(model)

            # The first stage also takes (prev_rows, last_sampled): the tokens still in flight
            # from the last step's sampler, as ModelRunner's forward does.
            def stage(params, kv_cache, x, md, logits_indices, *in_flight, graphdef=graphdef,
                      attend=attend, mesh=mesh, first=s == 0, is_last=s == last):
                count_compilation()  # runs at trace time: one trace is one compilation
                with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                    model = nnx.merge(graphdef, params)
                    h = model.embed(with_tokens_in_flight(x, *in_flight)) if first else x
                    h, kv_cache = model.forward_layers(h, kv_cache, md, attend, backend.layer_loop)
                    if not is_last:
                        return h, kv_cache
                    h = model.final_norm(h)
                    return h[logits_indices], h, kv_cache

            rep = NamedSharding(mesh, P())
            outs = (rep, rep, kv_cache.sharding) if s == last else (rep, kv_cache.sharding)
            ins = (jax.tree.map(lambda x: x.sharding, params), kv_cache.sharding, rep, rep, rep)
            jitted = jax.jit(stage, donate_argnums=(1,), out_shardings=outs,
                             in_shardings=ins + (rep, rep) * (s == 0))
            key = fingerprint(config, model.args, mesh.devices.shape, s)
            self.programs.append(CompiledProgram(f"forward_stage{s}", stage, jitted, key, directory,
                                                 list(mesh.devices.flat), (0, 1)))
            self.params.append(params)
            self.replicated.append(rep)
        # Stands in for the last sampler's tokens where none is in flight: no dependency.
        self.no_tokens = jax.device_put(np.zeros(self.max_num_seqs, np.int32), self.replicated[0])

    def __call__(self, params, kv_caches, input_ids, prev_rows, last_sampled, md, logits_indices):
        x, caches = input_ids, list(kv_caches)
        in_flight = (prev_rows, jax.device_put(last_sampled, self.replicated[0])
                     if (prev_rows < self.max_num_seqs).any() else self.no_tokens)
        for s, program in enumerate(self.programs[:-1]):
            x, caches[s] = program(self.params[s], caches[s], x, md, logits_indices, *in_flight)
            x, in_flight = jax.device_put(x, self.replicated[s + 1]), ()  # on to the next stage
        selected, hidden, caches[-1] = self.programs[-1](self.params[-1], caches[-1], x, md,
                                                         logits_indices, *in_flight)
        return selected, hidden, tuple(caches)

    def warmup_jobs(self, kv_caches, T: int, md: AttentionMetadata, logits_indices, hidden_size: int,
                    dtype, last_sampled) -> list[tuple[CompiledProgram, tuple, dict]]:
        """Every stage's program for token bucket T (later stages take hidden states)."""
        jobs = []
        for s, program in enumerate(self.programs):
            if s == 0:
                S = last_sampled.shape[0]
                x = (np.zeros(T, np.int32), np.full(T, S, np.int32), jax.ShapeDtypeStruct(
                    last_sampled.shape, last_sampled.dtype, sharding=self.replicated[0]))
            else:
                x = (jax.ShapeDtypeStruct((T, hidden_size), dtype, sharding=self.replicated[s]),)
            jobs.append((program, (self.params[s], kv_caches[s], x[0], md, logits_indices, *x[1:]), {}))
        return jobs


class PipelineModelRunner(ModelRunner):
    """ModelRunner with the forward split into stages; the last stage's model and mesh are
    the sampler's."""

    def __init__(self, config: EngineConfig, stages: list[nnx.Module], kv_caches: list[jax.Array],
                 attends: list, meshes: list[Mesh], backend: Backend):
        super().__init__(config, stages[-1], kv_caches[-1], attends[-1], mesh=meshes[-1], backend=backend)
        self.kv_cache = tuple(kv_caches)
        self._forward = PipelineForward(config, stages, kv_caches, [in_kv_cache_groups(a) for a in attends],
                                        meshes, backend, self._count_compilation, self._executables_dir)

    @property
    def programs(self) -> tuple[CompiledProgram, ...]:
        return (*self._forward.programs, self._prompt_logprobs, self._sample, self._sample_extended,
                self._set_row)

    def warmup_jobs(self) -> list[tuple[CompiledProgram, tuple, dict]]:
        jobs = []
        for program, args, static in super().warmup_jobs():
            if program is self._forward:
                _, _, input_ids, _, last_sampled, md, logits_indices = args
                jobs += self._forward.warmup_jobs(self.kv_cache, len(input_ids), md, logits_indices,
                                                  self.hidden_size, self.hidden_dtype, last_sampled)
            else:
                jobs.append((program, args, static))
        return jobs
