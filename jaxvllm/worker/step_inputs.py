"""A step's forward inputs, gathered from the persistent batch's rows with vectorized numpy
(vLLM's `_prepare_inputs`): no loop over requests, whatever their number.

Attention metadata has min(token bucket, max_num_seqs) rows: a step of T tokens holds at
most T sequences, so small steps stay small without compiling more programs than one per
token bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jaxvllm.layers.attention import AttentionMetadata
from jaxvllm.worker.input_batch import InputBatch


@dataclass
class StepInputs:
    input_ids: np.ndarray       # i32[T]
    # i32[T]: the row whose token sampled on device last step is this position's input (its
    # value is not on the host yet: async scheduling), else num_rows (the host's id stands).
    prev_rows: np.ndarray
    md: AttentionMetadata
    logits_indices: np.ndarray  # i32[max_num_seqs]: each request's last scheduled token
    commit: np.ndarray          # bool[N]: the request samples a kept token (not mid-prompt)


def metadata_rows(T: int, max_num_seqs: int) -> int:
    return min(T, max_num_seqs)


def build_step_inputs(batch: InputBatch, rows: np.ndarray, counts: np.ndarray, T: int,
                      block_size: int) -> StepInputs:
    """rows: each scheduled request's batch row, in step order; counts: its tokens."""
    N, S = len(rows), len(batch.num_tokens)
    M = metadata_rows(T, S)
    cu = np.cumsum(counts, dtype=np.int32)
    total = int(cu[-1])
    computed = batch.num_computed_tokens[rows]
    # Token j of the step belongs to request req[j], at position computed + its offset.
    req = np.repeat(np.arange(N, dtype=np.int32), counts)
    pos = computed[req] + np.arange(total, dtype=np.int32) - (cu - counts)[req]
    tok_rows = rows[req]
    input_ids = np.zeros(T, np.int32)
    input_ids[:total] = batch.token_ids[tok_rows, pos]
    prev_rows = np.full(T, S, np.int32)
    prev_rows[:total] = np.where(pos >= batch.num_host_tokens[tok_rows], tok_rows, S)
    positions = np.zeros(T, np.int32)
    positions[:total] = pos
    # Per KV cache group: where each token's K/V goes, and each request's block table.
    G = batch.block_table.shape[0]
    slot_mapping = np.tile(np.arange(T, dtype=np.int32) % block_size, (G, 1))  # padding -> the null block 0
    slot_mapping[:, :total] = batch.block_table[:, tok_rows, pos // block_size] * block_size + pos % block_size
    kv_lens = np.zeros(M, np.int32)
    kv_lens[:N] = computed + counts
    page_indices = np.zeros((G, M, batch.block_table.shape[2]), np.int32)
    page_indices[:, :N] = batch.block_table[:, rows]
    cu_q_lens = np.full(M + 1, total, np.int32)
    cu_q_lens[0] = 0
    cu_q_lens[1:N + 1] = cu
    logits_indices = np.zeros(S, np.int32)
    logits_indices[:N] = cu - 1
    md = AttentionMetadata(positions=positions, slot_mapping=slot_mapping, kv_lens=kv_lens,
                           page_indices=page_indices, cu_q_lens=cu_q_lens,
                           num_seqs=np.array([N], np.int32))
    commit = computed + counts >= batch.num_tokens[rows]
    return StepInputs(input_ids, prev_rows, md, logits_indices, commit)
