"""The rejection sampler (vLLM's RejectionSampler): which of each request's draft tokens the
target model accepts, and the token after them, in one jittable function with static shapes.

For R requests and K drafts, the verify step's logits hold K + 1 positions per request: the
target's distribution after its last token and after each draft. Position j's token is drawn
as the plain sampler would draw it there (temperature, min_p, top_k, top_p; worker/sampler.py):
- greedy rows accept drafts while each equals the target's argmax, then take the argmax at
  the first mismatch (or after the last draft: the bonus token);
- random rows accept draft j with probability p_j(draft_j): an n-gram draft is deterministic
  (q is one-hot), so min(1, p/q) is p, and the residual max(p - q, 0), normalized, is p with
  the draft removed. A rejected position draws from that residual, a fully accepted run draws
  its bonus token from p_K. The output is then distributed exactly as sampling one token at a
  time from the target would be.
Each position's randomness is keyed by the request's seed and the output index it samples, so
a seeded request draws the same whatever else is in the batch. No conditional and no loop: the
accepted length is a cumulative product, positions past it are padding (-1).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from jaxvllm.kernels.xla.argmax import first_argmax
from jaxvllm.worker.sampler import _SAMPLING_EPS, SamplingMetadata, _filter, _gumbel, _suppress

PLACEHOLDER = -1  # positions after the accepted run


def rejection_sample(logits: jax.Array, draft_ids: jax.Array, num_drafts: jax.Array, md: SamplingMetadata,
                     all_greedy: bool, top_k_top_p: bool | None = None,
                     argmax: Callable = first_argmax) -> tuple[jax.Array, jax.Array]:
    """logits f32[R, K + 1, V]; draft_ids i32[R, K], of which num_drafts i32[R] are real; md:
    each request's sampling rows (step: the output index of its position 0). Returns (tokens
    i32[R, K + 1]: the accepted drafts then one drawn token, PLACEHOLDER after; num_tokens
    i32[R], in [1, num_drafts + 1])."""
    R, K1, V = logits.shape
    K = K1 - 1
    pos = jnp.arange(K1, dtype=jnp.int32)
    has_draft = pos[None, :K] < num_drafts[:, None]
    # Each position's draft, or V (out of range: nothing) at the bonus position and padding.
    at = jnp.concatenate([jnp.where(has_draft, draft_ids, V), jnp.full((R, 1), V, jnp.int32)], axis=1)
    flat = jax.tree.map(lambda a: jnp.repeat(a, K1, axis=0), md)
    flat = flat.replace(step=flat.step + jnp.tile(pos, R))
    x = _suppress(logits.reshape(R * K1, V).astype(jnp.float32), flat.suppress_token_ids)
    target = argmax(x).reshape(R, K1)
    if all_greedy:
        accept, drawn = draft_ids == target[:, :K], target
    else:
        processed = _filter(x, flat, top_k_top_p)
        logp = jax.nn.log_softmax(processed, axis=-1)
        p_draft = jnp.exp(jnp.take_along_axis(logp, jnp.minimum(at.reshape(-1, 1), V - 1), axis=-1)).reshape(R, K1)
        u = _uniform(flat.seed, flat.step).reshape(R, K1)
        greedy = (md.temperature < _SAMPLING_EPS)[:, None]
        accept = jnp.where(greedy, draft_ids == target[:, :K], u[:, :K] < p_draft[:, :K])
        # The residual: p without the position's draft (nothing removed at the bonus position).
        residual = _suppress(processed, at.reshape(-1, 1))
        # (A draft holding all of p's mass is always accepted: its residual is never drawn.)
        noisy = argmax(residual + _gumbel(flat.seed, flat.step, V)).reshape(R, K1)
        drawn = jnp.where(greedy, target, noisy)
    num_accepted = jnp.sum(jnp.cumprod((accept & has_draft).astype(jnp.int32), axis=1), axis=1)
    last = jnp.take_along_axis(drawn, num_accepted[:, None], axis=1)
    padded = jnp.concatenate([draft_ids, jnp.zeros((R, 1), jnp.int32)], axis=1)
    a = num_accepted[:, None]
    tokens = jnp.where(pos < a, padded, jnp.where(pos == a, last, PLACEHOLDER))
    return tokens.astype(jnp.int32), num_accepted + 1


def _uniform(seed: jax.Array, step: jax.Array) -> jax.Array:
    """One uniform in [0, 1) per row from its seed and step, independent of the Gumbel noise
    the same (seed, step) keys (_gumbel hashes the folded key; this draws from a further fold)."""
    def one(s, t):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.wrap_key_data(s, impl="threefry2x32"), t), 1)
        return jax.random.uniform(key)
    return jax.vmap(one)(seed, step)
