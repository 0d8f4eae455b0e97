"""The sampler's inputs for one step: per-row numpy arrays padded to the request bucket,
built on the host from the requests' SamplingParams and state."""
from __future__ import annotations

import numpy as np

from jaxvllm.worker.penalties import PenaltyMetadata
from jaxvllm.worker.sampler import SamplingMetadata

MIN_SUPPRESS_BUCKET = 8  # token ids suppressed per row: powers of two from here


def sampling_metadata(states, R: int, vocab_size: int) -> tuple[SamplingMetadata, bool]:
    """The sampler's per-row inputs for R (bucketed) rows, and whether every row is greedy.
    Rows past `states` are padding (greedy, nothing suppressed)."""
    temperature = np.zeros(R, np.float32)
    top_k = np.zeros(R, np.int32)
    top_p = np.ones(R, np.float32)
    min_p = np.zeros(R, np.float32)
    seed = np.zeros((R, 2), np.uint32)
    step = np.zeros(R, np.int32)
    suppress = [s.ids_to_suppress() for s in states]
    K = MIN_SUPPRESS_BUCKET  # powers of two, so any number of stop ids compiles few shapes
    while K < max(map(len, suppress), default=0):
        K *= 2
    suppress_ids = np.full((R, K), vocab_size, np.int32)
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


def penalty_metadata(states, commits, R: int, max_num_seqs: int, vocab_size: int,
                     grammar_bitmask=None) -> PenaltyMetadata:
    """The extended sampler's per-row inputs; padding rows and uncommitted prefill chunks
    record nothing (their commit slot is max_num_seqs, which is dropped)."""
    slot = np.zeros(R, np.int32)
    commit_slot = np.full(R, max_num_seqs, np.int32)
    has_row = np.zeros(R, bool)
    presence = np.zeros(R, np.float32)
    frequency = np.zeros(R, np.float32)
    repetition = np.ones(R, np.float32)
    token_bitmask = np.full((R, -(-vocab_size // 32)), -1, np.int32)  # all allowed
    for i, (s, commit) in enumerate(zip(states, commits)):
        if grammar_bitmask and s.req_id in grammar_bitmask:
            token_bitmask[i] = grammar_bitmask[s.req_id]
        if s.has_row:
            p = s.sampling_params
            slot[i], has_row[i] = s.slot, True
            commit_slot[i] = s.slot if commit else max_num_seqs
            presence[i], frequency[i] = p.presence_penalty, p.frequency_penalty
            repetition[i] = p.repetition_penalty
    return PenaltyMetadata(slot=slot, commit_slot=commit_slot, has_row=has_row,
                           presence=presence, frequency=frequency, repetition=repetition,
                           token_bitmask=token_bitmask)
