"""ModelRunner: turns a SchedulerOutput into padded, bucketed device arrays and runs
the compiled step.

Two jitted functions make one step: `_forward` (model + KV write, then the final hidden
state of each request's last scheduled token; compiled once per token bucket, the KV cache
donated) and `_sample` (LM head and sampling; compiled once per request bucket and sampler
variant: greedy or random, and where the platform keeps conditionals out of a step, with or
without top_k/top_p), plus `_sample_extended` for batches using penalties, biases, logprobs or
structured output, which keeps per-request rows on device: worker/penalties.py).
Splitting them keeps the number of compiled programs at tokens + requests instead of
tokens x requests, and the costly 49k-wide LM head runs only for the rows that sample
(and, for requests asking for prompt logprobs, `_prompt_logprobs` over their prompt
positions). Hidden states stay on device between the calls; only sampled token ids (and
requested logprobs) come back to the host.
"""
from __future__ import annotations

import logging
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from jaxvllm.config import EngineConfig
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.platforms import Platform
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.worker import penalties
from jaxvllm.worker.compiled_programs import (CompiledProgram, executables_dir, fingerprint,
                                              persistent_cache_off, warm_all)
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.kv_swap import KVSwapper
from jaxvllm.worker.logprobs import accumulate_prompt_logprobs, prompt_positions, sampled_logprobs
from jaxvllm.worker.model_runner_utils import make_buckets, pick_bucket
from jaxvllm.worker.sampler import compute_logprobs, sample, sample_extended
from jaxvllm.worker.sampling_inputs import (penalty_metadata, sampler_variant, sampler_variants,
                                            sampling_metadata)

logger = logging.getLogger(__name__)


class ModelRunner:
    def __init__(self, config: EngineConfig, model: nnx.Module, kv_cache: jax.Array, attend,
                 num_swap_blocks: int = 0, *, mesh: Mesh, platform: Platform,
                 abstract_mesh: AbstractMesh | None = None):
        """abstract_mesh: the mesh the step is traced against (default: `mesh`'s); an abstract
        TPU's stands in to lower the step for a TPU elsewhere (benchmarks/lower_step.py)."""
        self.config = config
        self.step_may_branch = platform.step_may_branch  # else the host picks sampler variants
        self.block_size = config.cache.block_size
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_pages_per_seq = -(-config.scheduler.max_model_len // self.block_size)
        sched = config.scheduler
        self.token_buckets = make_buckets(min(sched.min_token_bucket, sched.max_num_batched_tokens),
                                          sched.max_num_batched_tokens)
        self.request_buckets = make_buckets(1, self.max_num_seqs)
        self.vocab_size = model.args.vocab_size
        self.hidden_size = model.args.hidden_size
        self.hidden_dtype = jax.numpy.dtype(config.dtype)
        self.kv_cache = kv_cache
        self.input_batch = InputBatch(self.max_num_seqs)
        # Replicated over the mesh, like the hidden states the sampler reads beside it.
        # Made by one jitted program (three eager zeros compiled three: ~0.5 s of start-up).
        self.penalty_state = jax.jit(penalties.init_state, static_argnums=(0, 1),
                                     out_shardings=NamedSharding(mesh, P()))(self.max_num_seqs, self.vocab_size)
        # Incremented at trace time: one trace is one compilation.
        self.num_compilations = 0
        self.num_warmup_compilations = 0
        self.after_first_step = None  # called once, after the first step's tokens are back
        self.swapper = (KVSwapper(kv_cache, num_swap_blocks, self._count_compilation)
                        if num_swap_blocks else None)

        graphdef, self.params = nnx.split(model)
        abstract_mesh = abstract_mesh or mesh.abstract_mesh

        def forward(params, kv_cache, input_ids, md, logits_indices):
            with jax.sharding.use_abstract_mesh(abstract_mesh):  # for the model's constraints
                hidden, kv_cache = nnx.merge(graphdef, params)(input_ids, kv_cache, md, attend,
                                                               platform.layer_loop)
            return hidden[logits_indices], hidden, kv_cache

        # num_reqs: the real rows of the request bucket; the LM head skips the others.
        def sample_fn(params, hidden, sampling_md, num_reqs, all_greedy, top_k_top_p):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                R = sampling_md.temperature.shape[0]
                logits = nnx.merge(graphdef, params).compute_logits(hidden[:R], num_reqs)
                return sample(logits, sampling_md, all_greedy, top_k_top_p)

        def sample_extended_fn(params, hidden, sampling_md, num_reqs, penalty_state, penalty_md, all_greedy,
                               top_k_top_p):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                R = sampling_md.temperature.shape[0]
                logits = nnx.merge(graphdef, params).compute_logits(hidden[:R], num_reqs)
                return sample_extended(logits, sampling_md, penalty_state, penalty_md, all_greedy, top_k_top_p)

        def prompt_logprobs_fn(params, hidden, indices, targets):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                logits = nnx.merge(graphdef, params).compute_logits(hidden[indices])
                return compute_logprobs(logits, targets)

        # Weights and cache keep their shardings; step inputs and hidden states are replicated.
        params_sharding = jax.tree.map(lambda x: x.sharding, self.params)
        self._replicated = rep = NamedSharding(mesh, P())
        key = fingerprint(config, model.args, mesh.devices.shape)
        self._executables_dir = directory = (
            executables_dir() if platform.serialize_executables and jax.process_count() == 1 else None)

        def program(name, fn, fixed_argnums, **jit_kwargs) -> CompiledProgram:
            def traced(*args, **kwargs):
                self.num_compilations += 1  # runs at trace time: one trace is one compilation
                return fn(*args, **kwargs)
            return CompiledProgram(name, fn, jax.jit(traced, **jit_kwargs), key, directory,
                                   list(mesh.devices.flat), fixed_argnums)

        # fixed_argnums: the weights, the KV cache and the penalty rows never change shape.
        self._forward = program("forward", forward, (0, 1), donate_argnums=(1,),
                                in_shardings=(params_sharding, kv_cache.sharding, rep, rep, rep),
                                out_shardings=(rep, rep, kv_cache.sharding))
        sampler_static = ("all_greedy", "top_k_top_p")
        self._sample = program("sample", sample_fn, (0,), static_argnames=sampler_static)
        self._sample_extended = program("sample_extended", sample_extended_fn, (0, 4),
                                        static_argnames=sampler_static, donate_argnums=(4,))
        self._set_row = program("set_row", penalties.set_row, (0,), donate_argnums=(0,))
        self._prompt_logprobs = program("prompt_logprobs", prompt_logprobs_fn, (0,))

    def _count_compilation(self) -> None:
        self.num_compilations += 1

    # ---- one step -----------------------------------------------------------------
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        for state in self.input_batch.update_states(out):
            if state.has_row:
                self._write_row(state)
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.kv_cache = self.swapper.swap(self.kv_cache, out.blocks_to_swap_out, out.blocks_to_swap_in)
        if out.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput([], [])
        req_ids = list(out.num_scheduled_tokens)
        states = [self.input_batch.requests[r] for r in req_ids]
        counts = [out.num_scheduled_tokens[r] for r in req_ids]
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            input_ids, md, logits_indices = self._prepare_inputs(states, counts)
        with jax.profiler.TraceAnnotation("model_step"):
            hidden, all_hidden, self.kv_cache = self._forward(self.params, self.kv_cache, input_ids, md,
                                                              logits_indices)
        if any(s.prompt_logprobs is not None for s in states):
            with jax.profiler.TraceAnnotation("prompt_logprobs"):
                indices, targets, spans = prompt_positions(states, counts, len(input_ids))
                if spans:
                    accumulate_prompt_logprobs(spans, jax.device_get(
                        self._prompt_logprobs(self.params, all_hidden, indices, targets)))
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            R = pick_bucket(self.request_buckets, len(states))
            sampling_md, all_greedy = sampling_metadata(states, R, self.vocab_size)
            variant = sampler_variant(sampling_md, all_greedy, self.vocab_size, self.step_may_branch)
            num_reqs = np.int32(len(states))
        # Rows whose token is kept: the others are prefill chunks short of the prompt's end.
        commits = [s.num_computed_tokens + n >= len(s.token_ids) for s, n in zip(states, counts)]
        logprobs = None
        with jax.profiler.TraceAnnotation("sampling"):
            if any(s.extended for s in states):
                penalty_md = penalty_metadata(states, commits, R, self.max_num_seqs, self.vocab_size,
                                              out.grammar_bitmask)
                sampled, lp, self.penalty_state = self._sample_extended(
                    self.params, hidden, sampling_md, num_reqs, self.penalty_state, penalty_md, **variant)
                sampled, lp = jax.device_get((sampled, lp))
                logprobs = sampled_logprobs(states, commits, sampled, lp)
            else:
                sampled = np.asarray(self._sample(self.params, hidden, sampling_md, num_reqs, **variant))

        sampled_token_ids, prompt_logprobs = [], {}
        for i, (state, n, commit) in enumerate(zip(states, counts, commits)):
            state.num_computed_tokens += n
            if commit:
                token = int(sampled[i])
                state.token_ids.append(token)
                sampled_token_ids.append([token])
                if state.prompt_logprobs is not None:
                    prompt_logprobs[state.req_id], state.prompt_logprobs = state.prompt_logprobs, None
            else:
                sampled_token_ids.append([])
        if self.after_first_step is not None:
            self.after_first_step, after = None, self.after_first_step
            after()
        if self.config.check_recompilation and self.num_compilations > self.num_warmup_compilations:
            raise RuntimeError(
                f"check_recompilation: {self.num_compilations - self.num_warmup_compilations} "
                f"program(s) compiled after warm-up (a shape outside the warmed buckets).")
        return ModelRunnerOutput(req_ids, sampled_token_ids, logprobs, prompt_logprobs)

    def _write_row(self, state) -> None:
        counts, prompt_mask, bias = penalties.build_row(
            state.sampling_params, state.token_ids[:state.num_prompt_tokens],
            state.token_ids[state.num_prompt_tokens:], self.vocab_size)
        self.penalty_state = self._set_row(self.penalty_state, np.int32(state.slot), counts,
                                           prompt_mask, bias)

    def _prepare_inputs(self, states, counts):
        num_tokens = sum(counts)
        T = pick_bucket(self.token_buckets, num_tokens)
        S, bs = self.max_num_seqs, self.block_size
        input_ids = np.zeros(T, np.int32)
        positions = np.zeros(T, np.int32)
        slot_mapping = np.arange(T, dtype=np.int32) % bs  # padding writes into the null block 0
        kv_lens = np.zeros(S, np.int32)
        page_indices = np.zeros((S, self.max_pages_per_seq), np.int32)
        cu_q_lens = np.full(S + 1, num_tokens, np.int32)
        cu_q_lens[0] = 0
        logits_indices = np.zeros(S, np.int32)

        offset = 0
        for i, (state, n) in enumerate(zip(states, counts)):
            start = state.num_computed_tokens
            pos = np.arange(start, start + n, dtype=np.int32)
            blocks = np.asarray(state.block_ids, np.int32)
            input_ids[offset:offset + n] = state.token_ids[start:start + n]
            positions[offset:offset + n] = pos
            slot_mapping[offset:offset + n] = blocks[pos // bs] * bs + pos % bs
            kv_lens[i] = start + n
            page_indices[i, :len(blocks)] = blocks
            offset += n
            cu_q_lens[i + 1] = offset
            logits_indices[i] = offset - 1
        md = AttentionMetadata(positions=positions, slot_mapping=slot_mapping, kv_lens=kv_lens,
                               page_indices=page_indices, cu_q_lens=cu_q_lens,
                               num_seqs=np.array([len(states)], np.int32))
        return input_ids, md, logits_indices

    # ---- compile discipline -------------------------------------------------------
    def warmup(self) -> None:
        """Have a program for every token bucket and every request bucket (greedy and
        sampling, plain and extended) and the row writer before serving, so that serving
        never waits on the compiler. Ahead of time: nothing runs and nothing large is
        allocated (hidden states are ShapeDtypeStructs); saved programs load from disk in the
        background, and a step waits only for the programs it runs."""
        start = time.perf_counter()
        with persistent_cache_off(self._executables_dir is not None):
            warm_all(self.warmup_jobs())
        if self.swapper is not None:
            self.kv_cache = self.swapper.warmup(self.kv_cache)
        jax.block_until_ready(self.kv_cache)
        self.num_warmup_compilations = self.num_compilations
        loading = sum(len(p.loading) for p in self.programs)
        logger.info("Warm-up: %d programs compiled in %.1f s, %d loading from disk in the background "
                    "(token buckets %s, request buckets %s).", self.num_compilations,
                    time.perf_counter() - start, loading, self.token_buckets, self.request_buckets)

    @property
    def programs(self) -> tuple[CompiledProgram, ...]:
        return (self._forward, self._prompt_logprobs, self._sample, self._sample_extended, self._set_row)

    def warmup_jobs(self) -> list[tuple[CompiledProgram, tuple, dict]]:
        """(program, args, static) for every program serving may run; hidden states are
        ShapeDtypeStructs (benchmarks/lower_step.py lowers some of these for a TPU or GPU)."""
        S, rep = self.max_num_seqs, self._replicated
        # The forward's outputs (final hidden states of the sampled rows and of all tokens).
        hidden = jax.ShapeDtypeStruct((S, self.hidden_size), self.hidden_dtype, sharding=rep)
        # In the order a plain step needs them (saved ones load in this order): forward and
        # sample first, smallest buckets first; then logprobs, penalties and the row writer.
        jobs, extra = [], []
        for T in self.token_buckets:
            md = AttentionMetadata(
                positions=np.zeros(T, np.int32), slot_mapping=np.arange(T, dtype=np.int32) % self.block_size,
                kv_lens=np.zeros(S, np.int32), page_indices=np.zeros((S, self.max_pages_per_seq), np.int32),
                cu_q_lens=np.zeros(S + 1, np.int32), num_seqs=np.zeros(1, np.int32))
            all_hidden = jax.ShapeDtypeStruct((T, self.hidden_size), self.hidden_dtype, sharding=rep)
            jobs.append((self._forward, (self.params, self.kv_cache, np.zeros(T, np.int32), md,
                                         np.zeros(S, np.int32)), {}))
            extra.append((self._prompt_logprobs, (self.params, all_hidden, np.zeros(T, np.int32),
                                                  np.zeros(T, np.int32)), {}))
        for R in self.request_buckets:
            md, _ = sampling_metadata([], R, self.vocab_size)
            penalty_md = penalty_metadata([], [], R, self.max_num_seqs, self.vocab_size)
            for variant in sampler_variants(self.step_may_branch):
                jobs.append((self._sample, (self.params, hidden, md, np.int32(R)), variant))
                extra.append((self._sample_extended, (self.params, hidden, md, np.int32(R), self.penalty_state,
                                                      penalty_md), variant))
        extra.append((self._set_row, (self.penalty_state, np.int32(0)) + penalties.build_row(
            SamplingParams(), [0], [], self.vocab_size), {}))
        return jobs + extra
