"""The model runner with speculative decoding: each request's last token and its drafts run
through the target model in one forward (the ragged attention kernels take several query
tokens per sequence, as for a prefill chunk), and one compiled `verify` program computes the
logits of every drafted position and runs the rejection sampler (rejection_sampler.py) on
device: no host round trip between scoring and accepting. As `sample_extended` does for the
plain runner, verify's extended variant (a step with penalty or bias rows, logprobs or
structured output) also returns the emitted tokens' raw logprobs; prompt logprobs come from
the forward as without speculation.

Shapes stay static: K = num_speculative_tokens is fixed per engine, the forward returns K + 1
hidden states per request row (a request with fewer drafts, or none, pads by repeating its
last position, masked in the sampler), and `verify` is compiled per request bucket and sampler
variant, like `sample`, which it replaces. Steps run synchronously (the proposer reads the
accepted tokens on the host before the next step is scheduled); the plain runner is untouched.

Drafts come from a proposer on the host (ngram_proposer.py, suffix_proposer.py), or from a
drafter on device that runs after verify on its tokens, without the host in between: a draft
model (draft_model.py) or an EAGLE-3 head (eagle.py), their KV in the target's blocks.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.logprobs import accepted_logprobs
from jaxvllm.worker.model_runner import ModelRunner
from jaxvllm.worker.model_runner_utils import pick_bucket
from jaxvllm.worker.penalties import penalized_positions, record_accepted
from jaxvllm.worker.sampler import compute_logprobs
from jaxvllm.worker.sampling_inputs import penalty_metadata, sampler_variant, sampler_variants, sampling_metadata
from jaxvllm.worker.spec_decode.draft_model import DraftModel
from jaxvllm.worker.spec_decode.eagle import EagleProposer
from jaxvllm.worker.spec_decode.ngram_proposer import NgramProposer
from jaxvllm.worker.spec_decode.rejection_sampler import rejection_sample
from jaxvllm.worker.spec_decode.suffix_proposer import SuffixProposer
from jaxvllm.worker.step_inputs import build_step_inputs
from jaxvllm.worker.warmup import warmup_jobs


@dataclass
class SpecDecodeOutput:
    """A dispatched verify step (the `AsyncModelRunnerOutput` of this runner): get_output
    writes each request's accepted tokens into its row, uncomputes its rejected drafts and
    asks the proposer for the next drafts."""
    batch: InputBatch
    req_ids: list[str]
    rows: np.ndarray        # i32[N]
    commit: np.ndarray      # bool[N]: it samples (not mid-prompt)
    num_drafts: np.ndarray  # i32[N]
    tokens: jax.Array       # i32[R, K + 1]
    num_tokens: jax.Array   # i32[R]
    proposer: NgramProposer | SuffixProposer | None  # None: the drafter's `drafts`
    drafts: jax.Array | None  # i32[rows, K]: a drafter's, on device
    on_ready: object = None
    logprobs: tuple | None = None  # verify's (device) logprobs arrays, if some request asked
    num_logprobs: np.ndarray | None = None  # i32[N]: k asked for, -1 for none
    prompt_logprobs: dict | None = None  # req_id -> LogprobsLists, for the prompts done this step

    def __post_init__(self) -> None:
        for x in (self.tokens, self.num_tokens) + tuple(self.logprobs or ()) + (
                () if self.drafts is None else (self.drafts,)):
            x.copy_to_host_async()

    def get_output(self) -> ModelRunnerOutput:
        N, batch, rows = len(self.req_ids), self.batch, self.rows
        tokens = np.asarray(self.tokens)[:N]
        n = np.where(self.commit, np.asarray(self.num_tokens)[:N], 0)
        if self.on_ready is not None:
            self.on_ready()
        keep = np.arange(tokens.shape[1])[None, :] < n[:, None]
        start = batch.num_host_tokens[rows]
        batch.token_ids[np.repeat(rows, n), (start[:, None] + np.arange(tokens.shape[1]))[keep]] = tokens[keep]
        batch.num_tokens[rows] = batch.num_host_tokens[rows] = start + n
        batch.num_computed_tokens[rows] -= np.where(n > 0, self.num_drafts + 1 - n, 0)
        drafts = [[] for _ in range(N)]
        which = np.flatnonzero((n > 0) & ~batch.suppresses[rows])  # min_tokens, bad words: no drafts
        if self.proposer is None:
            proposals = np.asarray(self.drafts)[which].tolist()
        else:
            proposals = self.proposer.propose(batch.token_ids, batch.num_host_tokens, rows[which],
                                              batch.num_prompt_tokens, [self.req_ids[i] for i in which.tolist()])
        for i, d in zip(which.tolist(), proposals):
            drafts[i] = d
        token_lists = [t[:k] for t, k in zip(tokens.tolist(), n.tolist())]
        logprobs = (None if self.logprobs is None else
                    accepted_logprobs(self.num_logprobs, n, tokens, jax.device_get(self.logprobs)))
        return ModelRunnerOutput(self.req_ids, token_lists, logprobs, self.prompt_logprobs or {},
                                 spec_token_ids=drafts)


class SpecDecodeModelRunner(ModelRunner):
    def __init__(self, config, model, kv_cache, attend, *args, draft_model=None, **kwargs):
        """draft_model: method draft_model's model or eagle3's head, its layers in kv_cache
        after the target's."""
        spec = config.speculative
        if draft_model is not None:
            self.draft_args = draft_model.args
        if spec.method == "eagle3":  # the target's forward also returns the head's input
            self.aux_hidden_state_layers = draft_model.args.aux_layers(model.args.num_layers)
        super().__init__(config, model, kv_cache, attend, *args, **kwargs)
        self.num_spec_tokens = K = spec.num_speculative_tokens
        max_len = config.scheduler.max_model_len
        sp, argmax = self.step_params, kwargs["backend"].sampler_argmax
        pad_rows = self.max_num_seqs if spec.method == "eagle3" else 0
        abstract_mesh = kwargs.get("abstract_mesh") or kwargs["mesh"].abstract_mesh
        # A proposer on the host (n-gram, suffix) or a drafter on device (a draft model, EAGLE-3).
        self.proposer = self.drafter = None
        if spec.method in ("draft_model", "eagle3"):
            self.drafter = (EagleProposer if spec.method == "eagle3" else DraftModel)(
                self, draft_model, attend, kwargs.get("kv_cache_groups"), model.args.num_layers, kwargs["backend"],
                abstract_mesh)
        elif spec.method == "suffix":
            self.proposer = SuffixProposer(K, max_len, spec.suffix_decoding_max_tree_depth,
                                           spec.suffix_decoding_max_cached_requests,
                                           spec.suffix_decoding_max_spec_factor, spec.suffix_decoding_min_token_prob)
        else:
            self.proposer = NgramProposer(spec.prompt_lookup_min, spec.prompt_lookup_max, K, max_len)

        def verify_fn(head_leaves, hidden, sampling_md, num_reqs, draft_ids, num_drafts, penalty_state,
                      penalty_md, all_greedy, top_k_top_p):
            """penalty_state and penalty_md (its token_bitmask one row per verified position):
            the extended variant, for steps where some request has a penalty or bias row,
            logprobs or structured output; None makes the program without them. Returns
            (tokens, num_tokens, the penalty state with the emitted tokens counted, and every
            position's raw logprobs of its token), the last two None in the plain variant."""
            with jax.sharding.use_abstract_mesh(abstract_mesh):
                R = sampling_md.temperature.shape[0]
                raw = sp.head_model(head_leaves).compute_logits(hidden[:R * (K + 1)], num_reqs * (K + 1))
                logits = raw.reshape(R, K + 1, -1)
                if penalty_md is not None:
                    logits = penalized_positions(logits, penalty_state, penalty_md, draft_ids, num_drafts)
                tokens, num_tokens = rejection_sample(logits, draft_ids, num_drafts, sampling_md, all_greedy,
                                                      top_k_top_p, argmax)
                extended = (None, None) if penalty_md is None else (
                    record_accepted(penalty_state, penalty_md, tokens, num_tokens),
                    compute_logprobs(raw, tokens.reshape(-1)))
                if pad_rows:  # to max_num_seqs: the EAGLE proposer is compiled per token bucket alone
                    tokens, num_tokens = (jnp.pad(x, ((0, pad_rows - R),) + ((0, 0),) * (x.ndim - 1))
                                          for x in (tokens, num_tokens))
                return tokens, num_tokens, *extended

        self._verify = self._program("verify", verify_fn, (0,), static_argnames=("all_greedy", "top_k_top_p"),
                                     donate_argnums=(6,), out_shardings=self._replicated)

    def execute_model_async(self, out) -> SpecDecodeOutput:
        if self.proposer is not None:
            self.proposer.finish_requests(out.finished_req_ids)
        if out.total_num_scheduled_tokens == 0:
            return super().execute_model_async(out)  # states and swaps only; no tokens come back
        batch = self.input_batch
        for state in batch.update_states(out):
            if state.has_row:
                self._write_row(state)
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.kv_cache = self.swapper.swap(self.kv_cache, out.blocks_to_swap_out, out.blocks_to_swap_in)
        N, K1 = len(out.num_scheduled_tokens), self.num_spec_tokens + 1
        R = pick_bucket(self.request_buckets, N)
        draft_ids, num_drafts = np.zeros((R, K1 - 1), np.int32), np.zeros(R, np.int32)
        req_ids = list(out.num_scheduled_tokens)
        counts = np.fromiter(out.num_scheduled_tokens.values(), np.int32, N)
        rows = np.fromiter(map(batch.slot_of.__getitem__, req_ids), np.int32, N)
        if out.scheduled_spec_decode_tokens:
            index = {r: i for i, r in enumerate(req_ids)}
            for req_id, drafts in out.scheduled_spec_decode_tokens.items():
                i, d = index[req_id], len(drafts)
                draft_ids[i, :d], num_drafts[i] = drafts, d
                n = batch.num_tokens[rows[i]]
                batch.token_ids[rows[i], n:n + d] = drafts  # the verify step's input ids
        with jax.profiler.TraceAnnotation("prepare_inputs"):
            T = pick_bucket(self.token_buckets, out.total_num_scheduled_tokens)
            inputs = build_step_inputs(batch, rows, counts, T, self.block_size)
            inputs.prev_rows[:] = self.max_num_seqs  # synchronous steps: every input id is on the host
            d = num_drafts[:N]
            logits_indices = np.zeros(self.max_num_seqs * K1, np.int32)  # K + 1 positions per request
            logits_indices[:N * K1] = ((np.cumsum(counts) - 1 - d)[:, None]
                                       + np.minimum(np.arange(K1), d[:, None])).ravel()
        with jax.profiler.TraceAnnotation("model_step"):
            hidden, all_hidden, self.kv_cache, *aux = self._forward(
                self.param_leaves, self.kv_cache, inputs.input_ids, inputs.prev_rows, self.last_sampled,
                inputs.md, logits_indices)
            if self.drafter is not None:
                self.kv_cache = self.drafter.after_forward(self.kv_cache, inputs)
        prompt_logprobs = self._prompt_logprobs_of(rows, counts, inputs.commit, all_hidden, T)
        with jax.profiler.TraceAnnotation("sampling"):
            sampling_md, all_greedy = sampling_metadata(batch, rows, R, self.vocab_size)
            variant = sampler_variant(sampling_md, all_greedy, self.vocab_size, self.step_may_branch)
            penalty = (None, None)
            if batch.extended[rows].any():  # penalty or bias rows, logprobs, structured output
                pmd = penalty_metadata(batch, rows, inputs.commit, R, self.max_num_seqs, self.vocab_size)
                penalty = (self.penalty_state, pmd.replace(token_bitmask=self._position_bitmask(
                    out.grammar_bitmask, req_ids, R)))
            tokens, num_tokens, state, logprobs = self._verify(
                self.head_leaves, hidden, sampling_md, np.int32(N), draft_ids, num_drafts, *penalty, **variant)
            if state is not None:
                self.penalty_state = state
            num_logprobs = batch.num_logprobs[rows]
            if not (num_logprobs >= 0).any():
                logprobs = None
        drafts = None
        if self.drafter is not None:  # from verify's tokens, still on device
            with jax.profiler.TraceAnnotation("propose"):
                drafts, self.kv_cache = self.drafter.propose(self.kv_cache, batch, rows, counts, d, inputs, R,
                                                             tokens, num_tokens, aux)
        batch.num_computed_tokens[rows] += counts
        self._check_recompilation()
        on_ready, self.after_first_step = self.after_first_step, None
        return SpecDecodeOutput(batch, req_ids, rows, inputs.commit, d, tokens, num_tokens, self.proposer,
                                drafts, on_ready, logprobs, num_logprobs, prompt_logprobs)

    def _position_bitmask(self, grammar_bitmask: dict[str, list[int]], req_ids: list[str], R: int) -> np.ndarray:
        """Structured output's allowed tokens at each verified position, i32[R * (K + 1), words]
        (the scheduler's rows for a request's positions; all bits set elsewhere)."""
        words, K1 = -(-self.vocab_size // 32), self.num_spec_tokens + 1
        bitmask = np.full((R, K1, words), -1, np.int32)
        index = {r: i for i, r in enumerate(req_ids)}
        for req_id, flat in (grammar_bitmask or {}).items():
            positions = np.asarray(flat, np.int32).reshape(-1, words)
            bitmask[index[req_id], :len(positions)] = positions
        return bitmask.reshape(R * K1, words)

    @property
    def programs(self):
        drafter = () if self.drafter is None else self.drafter.programs
        return (self._forward, self._prompt_logprobs, self._verify, self._set_row, *drafter)

    def warmup_jobs(self):
        """The forward and prompt logprobs for every token bucket (K + 1 hidden states per
        request), and `verify` for every request bucket and sampler variant, plain and
        extended (penalty rows, logprobs, structured output)."""
        S, K1, rep = self.max_num_seqs, self.num_spec_tokens + 1, self._replicated
        jobs = [(program, args[:-1] + (np.zeros(S * K1, np.int32),) if program is self._forward else args, static)
                for program, args, static in warmup_jobs(self)
                if program in (self._forward, self._prompt_logprobs, self._set_row)]
        if self.drafter is not None:
            jobs += self.drafter.warmup_jobs(self, [job for job in jobs if job[0] is self._forward])
        hidden = jax.ShapeDtypeStruct((S * K1, self.hidden_size), self.hidden_dtype, sharding=rep)
        no_rows = np.zeros(0, np.int32)
        for R in self.request_buckets:
            md, _ = sampling_metadata(None, no_rows, R, self.vocab_size)
            pmd = penalty_metadata(None, no_rows, no_rows, R, S, self.vocab_size)
            extended = (self.penalty_state, pmd.replace(token_bitmask=self._position_bitmask({}, [], R)))
            for variant in sampler_variants(self.step_may_branch):
                for penalty in ((None, None), extended):
                    jobs.append((self._verify, (self.head_leaves, hidden, md, np.int32(R),
                                                np.zeros((R, K1 - 1), np.int32), np.zeros(R, np.int32), *penalty),
                                 variant))
        return jobs


def runner_class(config) -> type[ModelRunner]:
    """The generate runner for this config: with speculative decoding or without."""
    return SpecDecodeModelRunner if config.speculative is not None else ModelRunner
