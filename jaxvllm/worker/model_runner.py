"""ModelRunner: turns a SchedulerOutput into padded, bucketed device arrays and runs
the compiled step.

Two jitted functions make one step: `_forward` (model + KV write, then the final hidden
state of each request's last scheduled token; compiled once per token bucket, the KV cache
donated) and `_sample` (LM head and sampling; compiled once per request bucket). Splitting them keeps the
number of compiled programs at tokens + requests instead of tokens x requests, and the
costly 49k-wide LM head runs only for the rows that sample. Hidden states stay on device
between the two calls; only sampled token ids come back to the host.
"""
from __future__ import annotations

import logging
import time

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxvllm.config import EngineConfig
from jaxvllm.core.sched_output import ModelRunnerOutput, SchedulerOutput
from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.kv_swap import KVSwapper
from jaxvllm.worker.model_runner_utils import make_buckets, pick_bucket
from jaxvllm.worker.sampler import SamplingMetadata, sample

logger = logging.getLogger(__name__)
_MIN_SUPPRESS_BUCKET = 8


class ModelRunner:
    def __init__(self, config: EngineConfig, model: nnx.Module, kv_cache: jax.Array, attend,
                 num_swap_blocks: int = 0, *, mesh: Mesh):
        self.config = config
        self.block_size = config.cache.block_size
        self.max_num_seqs = config.scheduler.max_num_seqs
        self.max_pages_per_seq = -(-config.scheduler.max_model_len // self.block_size)
        sched = config.scheduler
        self.token_buckets = make_buckets(min(sched.min_token_bucket, sched.max_num_batched_tokens),
                                          sched.max_num_batched_tokens)
        self.request_buckets = make_buckets(1, self.max_num_seqs)
        self.vocab_size = model.args.vocab_size
        self.kv_cache = kv_cache
        self.input_batch = InputBatch()
        # Incremented at trace time: one trace is one compilation.
        self.num_compilations = 0
        self.swapper = (KVSwapper(kv_cache, num_swap_blocks, self._count_compilation)
                        if num_swap_blocks else None)

        graphdef, self.params = nnx.split(model)

        def forward(params, kv_cache, input_ids, md, logits_indices):
            self.num_compilations += 1
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # for the model's constraints
                hidden, kv_cache = nnx.merge(graphdef, params)(input_ids, kv_cache, md, attend)
            return hidden[logits_indices], kv_cache

        def sample_fn(params, hidden, sampling_md, all_greedy):
            self.num_compilations += 1
            num_rows = sampling_md.temperature.shape[0]
            logits = nnx.merge(graphdef, params).compute_logits(hidden[:num_rows])
            return sample(logits, sampling_md, all_greedy)

        # Weights and cache keep their shardings; step inputs and hidden states are replicated.
        params_sharding = jax.tree.map(lambda x: x.sharding, self.params)
        rep = NamedSharding(mesh, P())
        self._forward = jax.jit(forward, donate_argnums=(1,),
                                in_shardings=(params_sharding, kv_cache.sharding, rep, rep, rep),
                                out_shardings=(rep, kv_cache.sharding))
        self._sample = jax.jit(sample_fn, static_argnames=("all_greedy",))

    def _count_compilation(self) -> None:
        self.num_compilations += 1

    # ---- one step -----------------------------------------------------------------
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput:
        self.input_batch.update_states(out)
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.kv_cache = self.swapper.swap(self.kv_cache, out.blocks_to_swap_out, out.blocks_to_swap_in)
        if out.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput([], [])
        req_ids = list(out.num_scheduled_tokens)
        states = [self.input_batch.requests[r] for r in req_ids]
        counts = [out.num_scheduled_tokens[r] for r in req_ids]
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            input_ids, md, logits_indices = self._prepare_inputs(states, counts)
            sampling_md, all_greedy = self._prepare_sampling(
                states, pick_bucket(self.request_buckets, len(states)))
        with jax.profiler.TraceAnnotation("model_step"):
            hidden, self.kv_cache = self._forward(self.params, self.kv_cache, input_ids, md,
                                                  logits_indices)
        with jax.profiler.TraceAnnotation("sampling"):
            sampled = np.asarray(self._sample(self.params, hidden, sampling_md, all_greedy=all_greedy))

        sampled_token_ids = []
        for i, (state, n) in enumerate(zip(states, counts)):
            state.num_computed_tokens += n
            if state.num_computed_tokens >= len(state.token_ids):
                token = int(sampled[i])
                state.token_ids.append(token)
                sampled_token_ids.append([token])
            else:
                sampled_token_ids.append([])  # a prefill chunk short of the prompt's end
        return ModelRunnerOutput(req_ids, sampled_token_ids)

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

    def _prepare_sampling(self, states, R: int) -> tuple[SamplingMetadata, bool]:
        temperature = np.zeros(R, np.float32)
        top_k = np.zeros(R, np.int32)
        top_p = np.ones(R, np.float32)
        min_p = np.zeros(R, np.float32)
        seed = np.zeros((R, 2), np.uint32)
        step = np.zeros(R, np.int32)
        suppress = [s.stop_ids_to_suppress() for s in states]
        K = _MIN_SUPPRESS_BUCKET  # powers of two, so any number of stop ids compiles few shapes
        while K < max(map(len, suppress)):
            K *= 2
        suppress_ids = np.full((R, K), self.vocab_size, np.int32)
        for i, s in enumerate(states):
            p = s.sampling_params
            temperature[i] = 0.0 if p.sampling_type_greedy else p.temperature
            top_k[i], top_p[i], min_p[i] = p.top_k, p.top_p, p.min_p
            seed[i] = (s.sampling_seed >> 32, s.sampling_seed & 0xFFFFFFFF)
            step[i] = s.num_output_tokens
            suppress_ids[i, :len(suppress[i])] = suppress[i]
        md = SamplingMetadata(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              seed=seed, step=step, suppress_token_ids=suppress_ids)
        return md, bool(np.all(temperature == 0.0))

    # ---- compile discipline -------------------------------------------------------
    def warmup(self) -> None:
        """Compile every token bucket and every request bucket (greedy and sampling) now,
        with all-padding inputs, so that serving never waits on the compiler."""
        start = time.perf_counter()
        S = self.max_num_seqs
        hidden = None
        for T in self.token_buckets:
            md = AttentionMetadata(
                positions=np.zeros(T, np.int32), slot_mapping=np.arange(T, dtype=np.int32) % self.block_size,
                kv_lens=np.zeros(S, np.int32), page_indices=np.zeros((S, self.max_pages_per_seq), np.int32),
                cu_q_lens=np.zeros(S + 1, np.int32), num_seqs=np.zeros(1, np.int32))
            hidden, self.kv_cache = self._forward(self.params, self.kv_cache, np.zeros(T, np.int32), md,
                                                  np.zeros(S, np.int32))
        for R in self.request_buckets:
            md = SamplingMetadata(
                temperature=np.ones(R, np.float32), top_k=np.zeros(R, np.int32), top_p=np.ones(R, np.float32),
                min_p=np.zeros(R, np.float32), seed=np.zeros((R, 2), np.uint32), step=np.zeros(R, np.int32),
                suppress_token_ids=np.full((R, _MIN_SUPPRESS_BUCKET), self.vocab_size, np.int32))
            for all_greedy in (True, False):
                self._sample(self.params, hidden, md, all_greedy=all_greedy)
        if self.swapper is not None:
            self.kv_cache = self.swapper.warmup(self.kv_cache)
        jax.block_until_ready(self.kv_cache)
        logger.info("Warm-up compiled %d programs in %.1f s (token buckets %s, request buckets %s).",
                    self.num_compilations, time.perf_counter() - start, self.token_buckets,
                    self.request_buckets)
