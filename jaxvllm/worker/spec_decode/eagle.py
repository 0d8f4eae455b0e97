"""EAGLE-3 as the proposer (method="eagle3"): the draft head (models/eagle3.py) reads three of
the target's hidden states, which the target's forward returns beside its own
(ModelRunner.aux_hidden_state_layers), and its one layer keeps its KV in the target's pool as
a draft model's layers do (draft_model.py: "draft.layers.0.self_attn").

The head's KV at position i stands for (the token at i + 1, the target's hidden state at i).
So after the verify step, one `propose_eagle` program (per token bucket) runs the head over
the step's tokens, each reading the token after it: the step's own next input where the
host has it (a prompt), else the token verify emitted at that place (on device: an accepted
draft equals it, and the last accepted position reads the bonus token). At each request's
last accepted position the head gives the first draft; k - 1 more steps of one token per
request follow, each from the head's own hidden state before its final norm, into the
lookahead slots. Positions past the accepted ones are written again before anything reads
them, as the target's are. Drafts are greedy (exact under the rejection sampler).

Verify's outputs come padded to max_num_seqs rows here, so that the program is compiled per
token bucket alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxvllm.layers.attention import in_kv_cache_groups
from jaxvllm.worker.spec_decode.draft_model import draft_groups_and_slots, one_token_metadata


class EagleProposer:
    def __init__(self, runner, model: nnx.Module, attend, kv_cache_groups, num_target_layers: int,
                 backend, abstract_mesh):
        graphdef, params = nnx.split(model)
        leaves, treedef = jax.tree.flatten(params)
        self.leaves = tuple(leaves)
        self.aux_size = 3 * model.args.target_hidden_size
        attend = in_kv_cache_groups(attend, *draft_groups_and_slots(kv_cache_groups, num_target_layers, 1))
        argmax, K, bs = backend.sampler_argmax, runner.num_spec_tokens, runner.block_size

        def propose(leaves, kv_cache, aux_hidden, step_ids, verify_index, req_of, tokens, num_tokens, commit,
                    p0_index, md, num_reqs):
            """aux_hidden [T, 3 x target hidden]: the forward's; step_ids i32[T]: each token's
            next token where the host has it; verify_index i32[T]: else its index among its
            request's verified tokens (-1: the host's); req_of i32[T]: its request;
            tokens i32[S, K + 1], num_tokens i32[S]: verify's; commit bool[M]: the request
            samples this step; p0_index i32[M]: the token index of its last non-draft token.
            Returns the drafts i32[M, K] and the cache."""
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                head = nnx.merge(graphdef, jax.tree.unflatten(treedef, list(leaves)))
                M, T = commit.shape[0], step_ids.shape[0]
                ids = jnp.where(verify_index >= 0, tokens[req_of, jnp.maximum(verify_index, 0)], step_ids)
                hidden = head.combine(aux_hidden, md.cu_q_lens[md.num_seqs[0]])
                normed, prenorm, kv_cache = head(ids, hidden, kv_cache, md, attend)
                n = jnp.where(commit & (jnp.arange(M) < num_reqs), num_tokens[:M], 0)
                last = jnp.clip(p0_index + n - 1, 0, T - 1)  # each request's last accepted position
                q, hidden = md.positions[last], prenorm[last]
                drafts = [head.draft_tokens(normed[last], num_reqs, argmax)]
                for _ in range(K - 1):
                    q = q + 1
                    normed, hidden, kv_cache = head(drafts[-1], hidden, kv_cache,
                                                    one_token_metadata(q, n > 0, md.page_indices, bs), attend)
                    drafts.append(head.draft_tokens(normed, num_reqs, argmax))
                return jnp.stack(drafts, axis=1), kv_cache

        self._propose = runner._program("propose_eagle", propose, (0, 1), donate_argnums=(1,),
                                        out_shardings=(runner._replicated, runner.kv_cache.sharding))

    @property
    def programs(self):
        return (self._propose,)

    def after_forward(self, kv_cache, inputs):
        return kv_cache  # the head runs after verify, on the tokens it accepted

    def propose(self, kv_cache, batch, rows, counts, num_drafts, inputs, R: int, tokens, num_tokens, aux):
        """(drafts i32[M, K], the cache) after verify (draft_model.DraftModel.propose's
        arguments; aux: the forward's captured hidden states)."""
        host = self.host_inputs(batch, rows, counts, num_drafts, inputs.commit, len(inputs.input_ids),
                                len(inputs.md.kv_lens))
        return self._propose(self.leaves, kv_cache, aux[0], *host[:3], tokens, num_tokens, *host[3:], inputs.md,
                             np.int32(len(rows)))

    def host_inputs(self, batch, rows: np.ndarray, counts: np.ndarray, num_drafts: np.ndarray,
                    commit: np.ndarray, T: int, M: int) -> tuple[np.ndarray, ...]:
        """step_ids, verify_index, req_of, commit and p0_index (see propose) for a step whose
        requests sit in `rows` with `counts` tokens and `num_drafts` drafts each."""
        N, total = len(rows), int(counts.sum())
        cu = np.cumsum(counts)
        req = np.repeat(np.arange(N, dtype=np.int32), counts)
        offset = np.arange(total) - (cu - counts)[req]  # each token's index in its request's chunk
        p0 = counts - 1 - num_drafts  # the last non-draft token's index in the chunk
        nxt = batch.num_computed_tokens[rows][req] + offset + 1  # the position of each token's next
        step_ids = np.zeros(T, np.int32)
        step_ids[:total] = batch.token_ids[rows[req], np.minimum(nxt, batch.token_ids.shape[1] - 1)]
        verify_index = np.full(T, -1, np.int32)
        verify_index[:total] = np.where(commit[req] & (offset >= p0[req]), offset - p0[req], -1)
        req_of = np.zeros(T, np.int32)
        req_of[:total] = req
        commit_m, p0_index = np.zeros(M, bool), np.zeros(M, np.int32)
        commit_m[:N], p0_index[:N] = commit, cu - counts + p0
        return step_ids, verify_index, req_of, commit_m, p0_index

    def warmup_jobs(self, runner, forward_jobs) -> list:
        """propose_eagle for every token bucket (the forward's inputs and metadata)."""
        S, K1, rep = runner.max_num_seqs, runner.num_spec_tokens + 1, runner._replicated
        jobs = []
        for _, args, _ in forward_jobs:
            T, md = args[2].shape[0], args[5]
            M = md.kv_lens.shape[0]
            aux = jax.ShapeDtypeStruct((T, self.aux_size), runner.hidden_dtype, sharding=rep)
            zeros = np.zeros(T, np.int32)
            jobs.append((self._propose, (self.leaves, runner.kv_cache, aux, zeros, zeros, zeros,
                                         jax.ShapeDtypeStruct((S, K1), np.int32, sharding=rep),
                                         jax.ShapeDtypeStruct((S,), np.int32, sharding=rep),
                                         np.zeros(M, bool), np.zeros(M, np.int32), md, np.int32(1)), {}))
        return jobs
