"""The warm-up plan: every program serving may run, for every bucket, and the warm-up that
has them all ready before the first request (vLLM's compile_or_warm_up_model).

A program for every token bucket and every request bucket (greedy and sampling, plain and
extended), the prompt-logprobs gather and the row writer, so that serving never waits on
the compiler. Ahead of time: nothing runs and nothing large is allocated (hidden states are
ShapeDtypeStructs); saved programs load from disk in the background, and a step waits only
for the programs it runs (worker/compiled_programs.py).
"""
from __future__ import annotations

import logging
import time

import jax
import numpy as np

from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.worker import penalties
from jaxvllm.worker.compiled_programs import CompiledProgram, persistent_cache_off, warm_all
from jaxvllm.worker.sampling_inputs import penalty_metadata, sampler_variants, sampling_metadata
from jaxvllm.worker.step_inputs import metadata_rows

logger = logging.getLogger(__name__)


def warmup(runner) -> None:
    start = time.perf_counter()
    with persistent_cache_off(runner._executables_dir is not None):
        warm_all(runner.warmup_jobs(), compile_threads=runner.compile_threads)
    if runner.swapper is not None:
        runner.kv_cache = runner.swapper.warmup(runner.kv_cache)
    jax.block_until_ready(runner.kv_cache)
    runner.num_warmup_compilations = runner.num_compilations
    loading = sum(len(p.loading) for p in runner.programs)
    logger.info("Warm-up: %d programs compiled in %.1f s, %d loading from disk in the background "
                "(token buckets %s, request buckets %s).", runner.num_compilations,
                time.perf_counter() - start, loading, runner.token_buckets, runner.request_buckets)


def warmup_jobs(runner) -> list[tuple[CompiledProgram, tuple, dict]]:
    """(program, args, static) for every program serving may run; hidden states are
    ShapeDtypeStructs (benchmarks/lower_step.py lowers some of these for a TPU or GPU)."""
    r = runner
    S, rep = r.max_num_seqs, r._replicated
    # The forward's outputs (final hidden states of the sampled rows and of all tokens).
    hidden = jax.ShapeDtypeStruct((S, r.hidden_size), r.hidden_dtype, sharding=rep)
    # In the order a plain step needs them (saved ones load in this order): forward and
    # sample first, smallest buckets first; then logprobs, penalties and the row writer.
    jobs, extra = [], []
    for T in r.token_buckets:
        M = metadata_rows(T, S)
        md = AttentionMetadata(
            positions=np.zeros(T, np.int32),
            slot_mapping=np.tile(np.arange(T, dtype=np.int32) % r.block_size, (r.num_kv_cache_groups, 1)),
            kv_lens=np.zeros(M, np.int32),
            page_indices=np.zeros((r.num_kv_cache_groups, M, r.max_pages_per_seq), np.int32),
            cu_q_lens=np.zeros(M + 1, np.int32), num_seqs=np.zeros(1, np.int32))
        all_hidden = jax.ShapeDtypeStruct((T, r.hidden_size), r.hidden_dtype, sharding=rep)
        forward_args = (r.param_leaves, r.kv_cache, np.zeros(T, np.int32), np.full(T, S, np.int32),
                        r.last_sampled, md, np.zeros(S, np.int32))
        jobs.append((r._forward, forward_args, {}))
        if r.lora_manager is not None:  # steps with adapters (model_runner.py)
            jobs.append((r._forward_lora, forward_args + (r.lora_manager.warmup_inputs(T),), {}))
        extra.append((r._prompt_logprobs, (r.head_leaves, all_hidden, np.zeros(T, np.int32),
                                           np.zeros(T, np.int32)), {}))
    no_rows = np.zeros(0, np.int32)
    for R in r.request_buckets:
        md, _ = sampling_metadata(None, no_rows, R, r.vocab_size)
        penalty_md = penalty_metadata(None, no_rows, no_rows, R, S, r.vocab_size)
        rows = np.full(R, S, np.int32)
        for variant in sampler_variants(r.step_may_branch):
            jobs.append((r._sample, (r.head_leaves, hidden, md, np.int32(R), r.last_sampled, rows), variant))
            extra.append((r._sample_extended, (r.head_leaves, hidden, md, np.int32(R), r.penalty_state,
                                               penalty_md, r.last_sampled, rows), variant))
    extra.append((r._set_row, (r.penalty_state, np.int32(0)) + penalties.build_row(
        SamplingParams(), [0], [], r.vocab_size), {}))
    return jobs + extra
