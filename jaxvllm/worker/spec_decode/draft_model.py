"""A draft model as the proposer (method="draft_model"): a smaller model with the target's
vocabulary, in the same worker and on the same mesh, its layers' KV in the target's pool.

Its attention layers are more layers of the KV cache spec ("draft.layers.i.self_attn",
Worker.get_kv_cache_spec), so they share the target's blocks: a block holds a page of every
target and draft layer, block tables, prefix-cache hits, swaps and frees cover both, and the
pool is sized for both. Each step, two programs run on device after the target's forward,
with no host round trip between them and the verify step:

- `draft_forward` (per token bucket): the draft over the step's own tokens, writing its KV
  at the positions the target wrote (a rejected draft's slot is written again next step);
- `propose` (per request bucket): from each request's last emitted token (verify's output,
  still on device), k greedy steps of one token per request, the loop unrolled in the
  program; their KV goes to the lookahead slots the scheduler allocated past the step's
  tokens (`num_lookahead_tokens`). A request that does not sample this step (mid-prompt)
  writes to the null block.

Greedy drafts are a deterministic function of the context, so the rejection sampler's
one-hot draft distribution is exact and the target's distribution is kept for random
sampling as for n-gram drafts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.core.kv_cache_interface import KVCacheGroupSpec
from jaxvllm.layers.attention import AttentionMetadata, in_kv_cache_groups

DRAFT_PREFIX = "draft."  # the draft's layer names in the KV cache spec


def draft_groups_and_slots(groups: list[KVCacheGroupSpec] | None, num_target_layers: int,
                           num_draft_layers: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each draft layer's KV cache group and slot (groups None: one group, after the target's)."""
    if not groups:
        return (0,) * num_draft_layers, tuple(range(num_target_layers, num_target_layers + num_draft_layers))
    where = {name: (g, i) for g, group in enumerate(groups) for i, name in enumerate(group.layer_names)}
    pairs = [where[f"{DRAFT_PREFIX}layers.{i}.self_attn"] for i in range(num_draft_layers)]
    return tuple(g for g, _ in pairs), tuple(s for _, s in pairs)


def one_token_metadata(q: jax.Array, live: jax.Array, page_tables: jax.Array, block_size: int) -> AttentionMetadata:
    """A draft step's attention metadata: row r's one token at position q[r], written to its
    slot where live[r] and the position has a page (else to the null block, reading one
    slot); page_tables i32[G, R, pages]."""
    R, P = q.shape[0], page_tables.shape[2]
    rows, page = jnp.arange(R), q // block_size
    live = live & (page < P)
    slots = page_tables[:, rows, jnp.minimum(page, P - 1)] * block_size + q % block_size
    return AttentionMetadata(positions=q, slot_mapping=jnp.where(live, slots, rows % block_size),
                             kv_lens=jnp.where(live, q + 1, 1), page_indices=page_tables,
                             cu_q_lens=jnp.arange(R + 1, dtype=jnp.int32), num_seqs=jnp.full(1, R, jnp.int32))


class DraftModel:
    """The draft's weights and its two programs, built by the spec runner (spec_runner.py)."""

    def __init__(self, runner, model: nnx.Module, attend, kv_cache_groups, num_target_layers: int,
                 backend, abstract_mesh):
        graphdef, params = nnx.split(model)
        self.leaves, treedef = jax.tree.flatten(params)
        self.leaves = tuple(self.leaves)
        self.num_layers = model.args.num_layers
        attend = in_kv_cache_groups(attend, *draft_groups_and_slots(kv_cache_groups, num_target_layers,
                                                                    self.num_layers))
        layer_loop, argmax = backend.layer_loop, backend.sampler_argmax
        K, bs = runner.num_spec_tokens, runner.block_size

        def draft(leaves):
            return nnx.merge(graphdef, jax.tree.unflatten(treedef, list(leaves)))

        def draft_forward(leaves, kv_cache, input_ids, md):
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                return draft(leaves)(input_ids, kv_cache, md, attend, layer_loop)[1]

        def propose(leaves, kv_cache, tokens, num_tokens, commit, next_pos, page_tables, num_reqs):
            """tokens i32[R, K + 1] and num_tokens i32[R]: verify's; commit bool[R]: the request
            samples this step; next_pos i32[R]: its first emitted token's position;
            page_tables i32[G, R, pages]. Returns the drafts, i32[R, K], and the cache."""
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                model = draft(leaves)
                rows = jnp.arange(tokens.shape[0])
                n = jnp.where(commit & (rows < num_reqs), num_tokens, 0)
                ids = tokens[rows, jnp.maximum(n - 1, 0)]
                pos = next_pos + n - 1  # the last emitted token's: the first draft step's input
                drafts = []
                for j in range(K):
                    md = one_token_metadata(pos + j, n > 0, page_tables, bs)
                    hidden, kv_cache = model(ids, kv_cache, md, attend, layer_loop)
                    ids = argmax(model.compute_logits(hidden, num_reqs))
                    drafts.append(ids)
                return jnp.stack(drafts, axis=1), kv_cache

        kv, rep = runner.kv_cache.sharding, runner._replicated
        self._draft_forward = runner._program("draft_forward", draft_forward, (0, 1), donate_argnums=(1,),
                                              out_shardings=kv)
        self._propose = runner._program("propose", propose, (0, 1), donate_argnums=(1,), out_shardings=(rep, kv))

    @property
    def programs(self):
        return self._draft_forward, self._propose

    def after_forward(self, kv_cache, inputs):
        """The draft's KV at the step's positions, from the target's inputs."""
        return self._draft_forward(self.leaves, kv_cache, inputs.input_ids, inputs.md)

    def propose(self, kv_cache, batch, rows, counts, num_drafts, inputs, R: int, tokens, num_tokens, aux):
        """(drafts i32[R, K], the cache) after verify: the step's requests sit in batch `rows`
        with `counts` tokens and `num_drafts` drafts each; tokens and num_tokens: verify's."""
        N = len(rows)
        commit, next_pos, tables = (np.zeros(R, bool), np.zeros(R, np.int32),
                                    np.zeros((batch.block_table.shape[0], R, batch.block_table.shape[2]), np.int32))
        commit[:N], tables[:, :N] = inputs.commit, batch.block_table[:, rows]
        next_pos[:N] = batch.num_computed_tokens[rows] + counts - num_drafts  # (not yet advanced by the step)
        return self._propose(self.leaves, kv_cache, tokens, num_tokens, commit, next_pos, tables, np.int32(N))

    def warmup_jobs(self, runner, forward_jobs) -> list:
        """draft_forward for every token bucket (the forward's inputs) and propose for every
        request bucket."""
        jobs = [(self._draft_forward, (self.leaves, runner.kv_cache, args[2], args[5]), {})
                for _, args, _ in forward_jobs]
        G, P, K1 = runner.num_kv_cache_groups, runner.max_pages_per_seq, runner.num_spec_tokens + 1
        for R in runner.request_buckets:  # verify's tokens: replicated device arrays
            tokens, num_tokens = (jax.ShapeDtypeStruct(shape, np.int32, sharding=runner._replicated)
                                  for shape in ((R, K1), (R,)))
            jobs.append((self._propose, (self.leaves, runner.kv_cache, tokens, num_tokens, np.zeros(R, bool),
                                         np.zeros(R, np.int32), np.zeros((G, R, P), np.int32), np.int32(R)), {}))
        return jobs
