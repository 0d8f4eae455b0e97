"""Penalties and biases on device, from rows that persist across steps.

vLLM's persistent InputBatch idea: each running request owns a row slot, and the
[max_num_seqs, vocab] arrays below keep that row's state on device. A row is written
once when its request arrives (prompt presence, counts of tokens generated before a
preemption, the constant bias) and the sampled tokens are added to the counts inside
the jitted sample step, so nothing per-vocabulary crosses from the host each step.
Only requests that use a penalty or bias get their row written (`uses_penalty_row`);
the others' rows may hold stale data and are neutralised per row (zero penalties, no bias).

Semantics are vLLM's (vllm/model_executor/layers/utils.py apply_penalties): repetition
divides positive logits and multiplies the others for tokens seen in the prompt or the
output; frequency subtracts penalty x output count, presence penalty x (count > 0).
"""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.sampling_params import SamplingParams


@flax.struct.dataclass
class PenaltyState:
    """Persistent per-slot rows, [S, V] each (S = max_num_seqs)."""
    output_counts: jax.Array  # i32: how often each token was generated
    prompt_mask: jax.Array    # bool: token occurs in the prompt
    bias: jax.Array           # f32: logit_bias, -inf for disallowed and one-token bad words


@flax.struct.dataclass
class PenaltyMetadata:
    """Per sampled row (R padded rows) of one step.

    slot: i32[R], the row's persistent slot.
    commit_slot: i32[R], the slot whose counts get this row's token, S (dropped) for
        padding rows and prefill chunks that sample nothing.
    has_row: bool[R], whether the slot was written for this request (else its bias is stale).
    presence, frequency, repetition: f32[R] (0, 0, 1 disable them).
    token_bitmask: i32[R, ceil(V / 32)], structured output's allowed tokens (token t is
        bit t % 32 of word t // 32); all bits set (-1) for unconstrained rows.
    """
    slot: jax.Array
    commit_slot: jax.Array
    has_row: jax.Array
    presence: jax.Array
    frequency: jax.Array
    repetition: jax.Array
    token_bitmask: jax.Array


def init_state(num_slots: int, vocab: int) -> PenaltyState:
    return PenaltyState(output_counts=jnp.zeros((num_slots, vocab), jnp.int32),
                        prompt_mask=jnp.zeros((num_slots, vocab), bool),
                        bias=jnp.zeros((num_slots, vocab), jnp.float32))


def set_row(state: PenaltyState, slot: jax.Array, counts: jax.Array, prompt_mask: jax.Array,
            bias: jax.Array) -> PenaltyState:
    return PenaltyState(output_counts=state.output_counts.at[slot].set(counts),
                        prompt_mask=state.prompt_mask.at[slot].set(prompt_mask),
                        bias=state.bias.at[slot].set(bias))


def apply_bias(x: jax.Array, state: PenaltyState, md: PenaltyMetadata) -> jax.Array:
    """The row's constant bias, then the step's structured-output mask."""
    x = x + jnp.where(md.has_row[:, None], state.bias[md.slot], 0.0)
    bits = md.token_bitmask[:, :, None] >> jnp.arange(32, dtype=jnp.int32)
    allowed = (bits & 1).reshape(x.shape[0], -1)[:, :x.shape[1]] == 1
    return jnp.where(allowed, x, -jnp.inf)


def apply_penalties(x: jax.Array, state: PenaltyState, md: PenaltyMetadata,
                    counts: jax.Array | None = None) -> jax.Array:
    """counts: each row's output counts (default: its slot's; speculative decoding adds the
    drafts before each verified position)."""
    counts = state.output_counts[md.slot] if counts is None else counts
    output_mask = counts > 0
    seen = output_mask | state.prompt_mask[md.slot]
    rep = jnp.where(seen, md.repetition[:, None], 1.0)
    x = jnp.where(x > 0, x / rep, x * rep)
    return x - md.frequency[:, None] * counts - md.presence[:, None] * output_mask


def record(state: PenaltyState, md: PenaltyMetadata, tokens: jax.Array) -> PenaltyState:
    """Counts the sampled tokens of the committing rows ("drop": slot S is no row)."""
    counts = state.output_counts.at[md.commit_slot, tokens].add(1, mode="drop")
    return state.replace(output_counts=counts)


def record_accepted(state: PenaltyState, md: PenaltyMetadata, tokens: jax.Array,
                    num_tokens: jax.Array) -> PenaltyState:
    """Speculative decoding's record: the first num_tokens i32[R] of each committing row's
    tokens i32[R, K + 1]."""
    keep = jnp.arange(tokens.shape[1])[None, :] < num_tokens[:, None]
    slots = jnp.where(keep, md.commit_slot[:, None], state.output_counts.shape[0])
    return state.replace(output_counts=state.output_counts.at[slots, tokens].add(1, mode="drop"))


def penalized_positions(logits: jax.Array, state: PenaltyState, md: PenaltyMetadata, draft_ids: jax.Array,
                        num_drafts: jax.Array) -> jax.Array:
    """Bias, structured output's mask and penalties at each verified position f32[R, K + 1, V]
    (md.token_bitmask holds a row per position), the output counts at position j being the
    row's plus its first j drafts (as if sampled one at a time)."""
    R, K1, V = logits.shape
    per_position = jax.tree.map(lambda a: jnp.repeat(a, K1, axis=0), md.replace(token_bitmask=None)).replace(
        token_bitmask=md.token_bitmask)  # every field a row per position; the bitmask has them already
    x = apply_bias(logits.reshape(R * K1, V), state, per_position)
    drafted = jnp.where(jnp.arange(K1 - 1)[None, :] < num_drafts[:, None], draft_ids, V)  # V: no token
    before = jnp.cumsum(jax.nn.one_hot(drafted, V, dtype=jnp.int32), axis=1)
    before = jnp.concatenate([jnp.zeros((R, 1, V), jnp.int32), before], axis=1)
    counts = (state.output_counts[md.slot][:, None, :] + before).reshape(R * K1, V)
    return apply_penalties(x, state, per_position, counts).reshape(R, K1, V)


def build_row(params: SamplingParams, prompt: list[int], outputs: list[int],
              vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Host copy of a new request's row: (output counts, prompt mask, bias)."""
    counts = np.bincount(np.asarray(outputs, np.int64), minlength=vocab).astype(np.int32)
    prompt_mask = np.zeros(vocab, bool)
    prompt_mask[np.asarray(prompt, np.int64)] = True
    bias = np.zeros(vocab, np.float32)
    for token, value in (params.logit_bias or {}).items():
        bias[token] = value
    if params.allowed_token_ids is not None:
        allowed = np.zeros(vocab, bool)
        allowed[params.allowed_token_ids] = True
        bias[~allowed] = -np.inf
    for word in params.bad_words_token_ids:
        if len(word) == 1:  # longer words depend on the output so far: banned step by step
            bias[word[0]] = -np.inf
    return counts, prompt_mask, bias
