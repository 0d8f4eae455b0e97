"""The sampler's inputs for one step: per-row numpy arrays padded to the request bucket,
gathered from the persistent batch's rows (worker/input_batch.py); only rows that suppress
tokens (min_tokens, multi-token bad words) are visited one by one."""
from __future__ import annotations

import numpy as np

from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.penalties import PenaltyMetadata
from jaxvllm.worker.sampler import SamplingMetadata

MIN_SUPPRESS_BUCKET = 8  # token ids suppressed per row: powers of two from here


def sampling_metadata(batch: InputBatch | None, rows: np.ndarray, R: int,
                      vocab_size: int) -> tuple[SamplingMetadata, bool]:
    """The sampler's per-row inputs for R (bucketed) rows, gathered from the batch's rows, and
    whether every row is greedy. Rows past `rows` are padding (greedy, nothing suppressed)."""
    N = len(rows)
    temperature = np.zeros(R, np.float32)
    top_k = np.zeros(R, np.int32)
    top_p = np.ones(R, np.float32)
    min_p = np.zeros(R, np.float32)
    seed = np.zeros((R, 2), np.uint32)
    step = np.zeros(R, np.int32)
    suppress = {}
    if N:
        temperature[:N], top_k[:N] = batch.temperature[rows], batch.top_k[rows]
        top_p[:N], min_p[:N], seed[:N] = batch.top_p[rows], batch.min_p[rows], batch.seed[rows]
        step[:N] = batch.num_tokens[rows] - batch.num_prompt_tokens[rows]  # counts one in flight
        for i in np.flatnonzero(batch.suppresses[rows]).tolist():  # min_tokens, bad words only
            suppress[i] = batch.suppressed_ids(batch.states[rows[i]])
    K = MIN_SUPPRESS_BUCKET  # powers of two, so any number of stop ids compiles few shapes
    while K < max(map(len, suppress.values()), default=0):
        K *= 2
    suppress_ids = np.full((R, K), vocab_size, np.int32)
    for i, ids in suppress.items():
        suppress_ids[i, :len(ids)] = ids
    md = SamplingMetadata(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          seed=seed, step=step, suppress_token_ids=suppress_ids)
    return md, not temperature.any()


def sampler_variant(md: SamplingMetadata, all_greedy: bool, vocab_size: int,
                    step_may_branch: bool) -> dict:
    """The sampler's static arguments for a batch (which compiled program runs it). Where the
    step may branch, whether any row uses top_k or top_p is decided on device; elsewhere here."""
    if step_may_branch:
        return dict(all_greedy=all_greedy, top_k_top_p=None)
    random = md.temperature > 0.0
    top_k = (md.top_k > 0) & (md.top_k < vocab_size)
    return dict(all_greedy=all_greedy, top_k_top_p=bool(np.any(random & (top_k | (md.top_p < 1.0)))))


def sampler_variants(step_may_branch: bool) -> list[dict]:
    """Every sampler variant `sampler_variant` can pick: the programs warm-up compiles."""
    if step_may_branch:
        return [dict(all_greedy=True, top_k_top_p=None), dict(all_greedy=False, top_k_top_p=None)]
    return [dict(all_greedy=True, top_k_top_p=False), dict(all_greedy=False, top_k_top_p=False),
            dict(all_greedy=False, top_k_top_p=True)]


def penalty_metadata(batch: InputBatch | None, rows: np.ndarray, commit: np.ndarray, R: int,
                     max_num_seqs: int, vocab_size: int, grammar_rows=None) -> PenaltyMetadata:
    """The extended sampler's per-row inputs; padding rows and uncommitted prefill chunks
    record nothing (their commit slot is max_num_seqs, which is dropped). grammar_rows: step
    row -> structured output's allowed-token words."""
    N = len(rows)
    slot = np.zeros(R, np.int32)
    commit_slot = np.full(R, max_num_seqs, np.int32)
    has_row = np.zeros(R, bool)
    presence = np.zeros(R, np.float32)
    frequency = np.zeros(R, np.float32)
    repetition = np.ones(R, np.float32)
    token_bitmask = np.full((R, -(-vocab_size // 32)), -1, np.int32)  # all allowed
    if N:
        has_row[:N] = row = batch.has_row[rows]
        slot[:N] = np.where(row, rows, 0)
        commit_slot[:N] = np.where(row & commit, rows, max_num_seqs)
        presence[:N] = np.where(row, batch.presence[rows], 0.0)
        frequency[:N] = np.where(row, batch.frequency[rows], 0.0)
        repetition[:N] = np.where(row, batch.repetition[rows], 1.0)
    for i, words in (grammar_rows or {}).items():
        token_bitmask[i] = words
    return PenaltyMetadata(slot=slot, commit_slot=commit_slot, has_row=has_row,
                           presence=presence, frequency=frequency, repetition=repetition,
                           token_bitmask=token_bitmask)
