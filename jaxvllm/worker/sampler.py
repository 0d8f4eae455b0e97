"""Token sampling on device: vLLM V1's sampler as one jittable function.

The order of operations is vLLM's (vllm/v1/sample/sampler.py): suppression on the raw
logits, argmax for greedy rows, and for random rows temperature, min_p, top_k, top_p,
then a draw from the softmax of what is left. Every filter reduces to a per-row logit
cutoff (keep the tokens whose logit is >= it), so no scatter back from sorted order is
needed and rows whose filters are disabled simply get a cutoff of -inf.

Cost on XLA:CPU (64 rows x 49152 tokens) shaped the choices below: a float sort takes
~1 s, a sort of the same values as int32 keys ~150 ms, lax.top_k(256) ~18 ms. So
top_k/top_p are skipped when no row uses them, worked out on the 256 largest logits
otherwise, and a full (int-key) sort runs only when some row's cutoff lies deeper.
Per-token threefry noise would cost more than all the rest, hence a keyed hash.

Those two choices are `lax.cond`s on device where the platform allows conditionals in a step
(the CPU). Elsewhere (GPU, TPU) the host makes the first one, `top_k_top_p`, and the program
for it is a separate compiled variant, as `all_greedy` is; its cutoff comes from a full sort.

`sample_extended` is the variant for batches where some request uses penalties, biases,
allowed/bad tokens or logprobs; batches without them run `sample`, which does none of it.
Logprobs are vLLM's default "raw_logprobs": log_softmax of the model's raw logits, before
any bias, penalty, temperature or filter.
"""
from __future__ import annotations

from typing import Callable

import flax
import jax
import jax.numpy as jnp
from jax import lax

from jaxvllm.kernels.xla.argmax import first_argmax
from jaxvllm.sampling_params import MAX_LOGPROBS
from jaxvllm.worker.penalties import PenaltyMetadata, PenaltyState, apply_bias, apply_penalties, record

_SAMPLING_EPS = 1e-5  # vLLM: temperatures below this mean greedy
_FAST_K = 256  # logits examined before falling back to a full sort


@flax.struct.dataclass
class SamplingMetadata:
    """Per-row sampling parameters as arrays, so one compiled sampler serves any batch.

    R is the padded row count; padded rows may hold any valid values (their tokens
    are discarded by the caller).
    temperature: f32[R], below 1e-5 means greedy.
    top_k: i32[R], 0, -1 or >= vocab size disables it.
    top_p: f32[R] in (0, 1], 1.0 disables it.
    min_p: f32[R] in [0, 1], 0.0 disables it.
    seed: u32[R, 2], (high, low) words of the request's 63-bit seed.
    step: i32[R], index of the output token being sampled (0 for the first one).
    suppress_token_ids: i32[R, K], ids whose logits become -inf (min_tokens' EOS and
        stop ids); entries >= vocab size are padding and ignored.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    min_p: jax.Array
    seed: jax.Array
    step: jax.Array
    suppress_token_ids: jax.Array


def sample(logits: jax.Array, md: SamplingMetadata, all_greedy: bool,
           top_k_top_p: bool | None = None, argmax: Callable = first_argmax) -> jax.Array:
    """Next token id per row, i32[R].

    `all_greedy` and `top_k_top_p` must be static. all_greedy: when True the whole random
    path (noise, sorting, filters) is left out of the compiled function. top_k_top_p:
    whether some row uses top_k or top_p; None decides it on device. argmax: the backend's
    (`Backend.sampler_argmax`).
    """
    return _draw(_suppress(logits.astype(jnp.float32), md.suppress_token_ids), md, all_greedy, top_k_top_p,
                 argmax)


def sample_extended(logits: jax.Array, md: SamplingMetadata, state: PenaltyState,
                    pmd: PenaltyMetadata, all_greedy: bool, top_k_top_p: bool | None = None,
                    argmax: Callable = first_argmax):
    """`sample` after bias and penalties (vLLM's order: bias and masks, then penalties),
    with raw logprobs. Returns (tokens i32[R], logprobs, state with the tokens counted);
    logprobs is (sampled token's logprob f32[R], its rank i32[R], top MAX_LOGPROBS ids
    i32[R, K] and logprobs f32[R, K])."""
    raw = logits.astype(jnp.float32)
    tokens = _draw(penalized_logits(raw, md, state, pmd), md, all_greedy, top_k_top_p, argmax)
    return tokens, compute_logprobs(raw, tokens), record(state, pmd, tokens)


def penalized_logits(logits: jax.Array, md: SamplingMetadata, state: PenaltyState,
                     pmd: PenaltyMetadata) -> jax.Array:
    """What `sample_extended` samples from, before temperature and filters, f32[R, V]."""
    x = _suppress(apply_bias(logits.astype(jnp.float32), state, pmd), md.suppress_token_ids)
    return apply_penalties(x, state, pmd)


def compute_logprobs(raw: jax.Array, tokens: jax.Array):
    """Raw logprobs of `tokens` (one per row) with their ranks, and each row's top
    MAX_LOGPROBS: (f32[R], i32[R], i32[R, K], f32[R, K]). Ranks and the top-k are taken
    on the logits (log_softmax only shifts each row), so no [R, V] logprobs are built."""
    lse = jax.nn.logsumexp(raw, axis=-1)
    token_raw = jnp.take_along_axis(raw, jnp.minimum(tokens, raw.shape[-1] - 1)[:, None], axis=-1)
    rank = jnp.sum(raw >= token_raw, axis=-1)  # vLLM's rank: 1 for the most likely token
    top_raw, top_ids = _top_k(raw, min(MAX_LOGPROBS, raw.shape[-1]))
    return token_raw[:, 0] - lse, rank.astype(jnp.int32), top_ids, top_raw - lse[:, None]


def _draw(x: jax.Array, md: SamplingMetadata, all_greedy: bool, top_k_top_p: bool | None,
          argmax: Callable) -> jax.Array:
    if all_greedy:
        return argmax(x)
    noisy = _filter(x, md, top_k_top_p) + _gumbel(md.seed, md.step, x.shape[-1])
    return jnp.where(md.temperature < _SAMPLING_EPS, argmax(x), argmax(noisy))


def processed_logits(logits: jax.Array, md: SamplingMetadata) -> jax.Array:
    """The logits a random row samples from (filtered-out tokens at -inf), f32[R, V].

    `sample` draws argmax(processed_logits + Gumbel noise), i.e. from their softmax.
    """
    return _filter(_suppress(logits.astype(jnp.float32), md.suppress_token_ids), md)


def _suppress(x: jax.Array, ids: jax.Array) -> jax.Array:
    rows = jnp.arange(x.shape[0])[:, None]
    return x.at[rows, ids].set(-jnp.inf, mode="drop")  # "drop": padding ids >= V


def _filter(x: jax.Array, md: SamplingMetadata, top_k_top_p: bool | None = None) -> jax.Array:
    """Temperature, then min_p, top_k and top_p, each on the result of the previous. Each
    filter keeps the logits at or above a per-row cutoff, so the largest cutoff applies them
    all in one pass over the vocabulary (x at or above min_p's and top_k/top_p's cutoffs is
    what filtering one after the other keeps)."""
    greedy = md.temperature < _SAMPLING_EPS
    x = x / jnp.where(greedy, 1.0, md.temperature)[:, None]
    # min_p: drop p_i < min_p * p_max, i.e. logit_i < max_logit + log(min_p) (log 0 = -inf).
    cutoff = jnp.max(x, axis=-1) + jnp.log(md.min_p)
    vocab = x.shape[-1]
    k = jnp.where(greedy | (md.top_k <= 0) | (md.top_k >= vocab), 0, md.top_k)
    p = jnp.where(greedy, 1.0, md.top_p)

    # top_k and top_p see what min_p left.
    if top_k_top_p is None:
        cutoff = lax.cond(jnp.any((k > 0) | (p < 1.0)),
                          lambda x, c, k, p: jnp.maximum(c, _top_k_top_p_cutoff(_keep_above(x, c), k, p)),
                          lambda x, c, k, p: c, x, cutoff, k, p)
    elif top_k_top_p:
        left = _keep_above(x, cutoff)
        cutoff = jnp.maximum(cutoff, _cutoff_from(left, _sort_descending(left), k, p)[0])
    return _keep_above(x, cutoff)


def _keep_above(x: jax.Array, cutoff: jax.Array) -> jax.Array:
    """x where it is at least its row's cutoff, else -inf."""
    return jnp.where(x < cutoff[:, None], -jnp.inf, x)


def _top_k_top_p_cutoff(x: jax.Array, k: jax.Array, p: jax.Array) -> jax.Array:
    """Per-row cutoff of top_k then top_p: from the _FAST_K largest logits when they
    reach every row's cutoff (the common case), else from a full sort.

    XLA:CPU runs lax.top_k as its fast TopK kernel only if it recognises the sort + slice
    that top_k lowers to; the barrier stops later slices of the result from merging into
    that pattern, which would turn it into a full float sort (~1 s).
    """
    largest = _top_k(x, min(_FAST_K, x.shape[-1]))[0]
    cutoff, found = _cutoff_from(x, largest, k, p)
    return lax.cond(jnp.all(found), lambda: cutoff,
                    lambda: _cutoff_from(x, _sort_descending(x), k, p)[0])


def _cutoff_from(x: jax.Array, desc: jax.Array, k: jax.Array,
                 p: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cutoff given `desc`, each row's n largest logits in descending order.

    top_k keeps logits >= the k-th largest (ties kept, as in vLLM). top_p follows
    vLLM's rule, drop a token when the ascending cumulative probability up to it is
    <= 1 - p, stated equivalently as: keep it while the probability mass strictly
    above it is < p (so the top token always stays); the probabilities are those left
    after top_k. Returns (cutoff f32[R], whether `desc` was long enough, bool[R]).
    """
    n, vocab = desc.shape[-1], x.shape[-1]
    kth = jnp.take_along_axis(desc, jnp.clip(k - 1, 0, n - 1)[:, None], axis=-1)
    top_k_cut = jnp.where(k[:, None] > 0, kth, -jnp.inf)
    top = desc[:, :1]
    z = jnp.sum(jnp.where(x >= top_k_cut, jnp.exp(x - top), 0.0), axis=-1, keepdims=True)
    probs = jnp.where(desc >= top_k_cut, jnp.exp(desc - top), 0.0) / z
    above = jnp.concatenate([jnp.zeros_like(z), jnp.cumsum(probs, axis=-1)[:, :-1]], axis=-1)
    n_keep = jnp.sum(above < p[:, None], axis=-1)
    last_kept = jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1)[:, 0]
    top_p_cut = jnp.where(p < 1.0, last_kept, -jnp.inf)
    found = (k <= n) & ((p >= 1.0) | (n_keep < n) | (n == vocab))
    return jnp.maximum(top_k_cut[:, 0], top_p_cut), found


def _top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """lax.top_k behind an optimization barrier on one device (see _top_k_top_p_cutoff).
    Under a multi-device mesh XLA's SPMD partitioner cannot handle the barrier (it
    aborts), so there the plain top_k is used."""
    result = lax.top_k(x, k)
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        result = lax.optimization_barrier(result)
    return result


def _sort_descending(x: jax.Array) -> jax.Array:
    """Full descending sort of each row, done on order-preserving int32 keys of the
    floats (flip the magnitude bits of negatives): ~6x faster than a float sort on CPU."""
    def flip(b):
        return jnp.where(b < 0, b ^ 0x7FFFFFFF, b)  # an involution
    keys = jnp.sort(flip(lax.bitcast_convert_type(x, jnp.int32)), axis=-1)[:, ::-1]
    return lax.bitcast_convert_type(flip(keys), jnp.float32)


def _gumbel(seed: jax.Array, step: jax.Array, vocab: int) -> jax.Array:
    """Gumbel noise, f32[R, vocab], from each row's own key: its seed words folded with
    its step, so a seeded request draws the same tokens whatever else is in the batch.

    Threefry only derives the row keys; the per-token bits come from a counter hash
    keyed by them (murmur3's finalizer, a bijection), because threefry for every token
    (jax.random.gumbel) costs ~3x the whole rest of the sampler on CPU.
    """
    keys = jax.vmap(jax.random.fold_in)(jax.random.wrap_key_data(seed, impl="threefry2x32"), step)
    k = jax.random.key_data(keys)
    token = lax.broadcasted_iota(jnp.uint32, (seed.shape[0], vocab), 1)
    bits = _fmix32(_fmix32(token ^ k[:, :1]) + k[:, 1:])
    u = ((bits >> 9).astype(jnp.float32) + 0.5) * 2.0**-23  # 23 bits, strictly in (0, 1)
    return -jnp.log(-jnp.log(u))


def _fmix32(h: jax.Array) -> jax.Array:
    h = (h ^ (h >> 16)) * jnp.uint32(0x85EBCA6B)
    h = (h ^ (h >> 13)) * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)
