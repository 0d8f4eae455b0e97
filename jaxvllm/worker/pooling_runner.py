"""PoolingModelRunner: the runner of runner="pooling" (vLLM's pooling path of its model
runner). Same persistent batch, step inputs and compiled forward as generation; where the
generate runner samples, this one pools.

A step's forward already returns each request's last scheduled row (LAST). Where a request
in the step pools its MEAN or CLS, `_pool` reduces the step's hidden states per request on
device (a segment sum and the first rows: [max_num_seqs, hidden] come back, not the tokens);
ALL copies the rows back. The host accumulates them across chunks (layers/pooler.py); when a
request's last prompt token is computed its pooled output is returned, embedded or passed
through the model's score head (`_classify`, its `compute_logits`), and the scheduler frees
its pages. One `_pool` program per token bucket and one `_classify` per request bucket.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.layers.pooler import PoolingState, classification, embedding
from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.worker.model_runner import ModelRunner
from jaxvllm.worker.model_runner_utils import pick_bucket
from jaxvllm.worker.step_inputs import build_step_inputs


@dataclass
class AsyncPoolingOutput:
    """A dispatched step whose pooled rows are still on device (the engine reads it as it
    reads AsyncModelRunnerOutput)."""
    runner: "PoolingModelRunner"
    req_ids: list[str]
    starts: np.ndarray   # i32[N]: each request's first position in the step
    counts: np.ndarray   # i32[N]: its tokens in the step
    finishing: np.ndarray  # bool[N]: the step computes its last prompt token
    last: jax.Array | None = None    # [S, hidden]: each request's last row
    totals: jax.Array | None = None  # [S, hidden]: the sum of its rows (MEAN)
    firsts: jax.Array | None = None  # [S, hidden]: its first row (CLS)
    hidden: jax.Array | None = None  # [T, hidden]: every row (ALL)

    def __post_init__(self) -> None:
        for x in (self.last, self.totals, self.firsts, self.hidden):
            if x is not None:
                x.copy_to_host_async()

    def get_output(self) -> ModelRunnerOutput:
        return self.runner.pooled_output(self)


class PoolingModelRunner(ModelRunner):
    def __init__(self, config, model, kv_cache, attend, num_swap_blocks: int = 0, **kwargs):
        super().__init__(config, model, kv_cache, attend, num_swap_blocks, **kwargs)
        self.convert = config.model.convert
        self.pooling: dict[str, PoolingState] = {}
        sp, S = self.step_params, self.max_num_seqs

        def pool_fn(hidden, segments, first_rows):
            hidden = hidden.astype(jnp.float32)
            return jax.ops.segment_sum(hidden, segments, num_segments=S), hidden[first_rows]

        def classify_fn(head_leaves, pooled):
            return sp.head_model(head_leaves).compute_logits(pooled)

        self._pool = self._program("pool", pool_fn, ())
        self._classify = self._program("classify", classify_fn, (0,))

    # ---- one step -----------------------------------------------------------------
    def execute_model_async(self, out: SchedulerOutput) -> AsyncPoolingOutput:
        batch = self.input_batch
        for req_id in out.finished_req_ids | out.preempted_req_ids:
            self.pooling.pop(req_id, None)  # a preempted request pools again from its restart
        batch.update_states(out)
        for new in out.scheduled_new_reqs:
            self.pooling[new.req_id] = PoolingState(new.pooling_params)
        if out.blocks_to_swap_out or out.blocks_to_swap_in:
            self.kv_cache = self.swapper.swap(self.kv_cache, out.blocks_to_swap_out, out.blocks_to_swap_in)
        N = len(out.num_scheduled_tokens)
        empty = np.zeros(0, np.int32)
        if out.total_num_scheduled_tokens == 0:
            return AsyncPoolingOutput(self, [], empty, empty, np.zeros(0, bool))
        req_ids = list(out.num_scheduled_tokens)
        counts = np.fromiter(out.num_scheduled_tokens.values(), np.int32, N)
        rows = np.fromiter(map(batch.slot_of.__getitem__, req_ids), np.int32, N)
        starts = batch.num_computed_tokens[rows].copy()
        T = pick_bucket(self.token_buckets, out.total_num_scheduled_tokens)
        inputs = build_step_inputs(batch, rows, counts, T, self.block_size)
        last, hidden, self.kv_cache = self._forward(
            self.param_leaves, self.kv_cache, inputs.input_ids, inputs.prev_rows, self.last_sampled,
            inputs.md, inputs.logits_indices)
        kinds = {self.pooling[r].params.pooling_type for r in req_ids}
        totals = firsts = None
        if kinds & {"MEAN", "CLS"}:
            segments = np.full(T, self.max_num_seqs, np.int32)  # padding: past the last segment, dropped
            segments[:counts.sum()] = np.repeat(np.arange(N, dtype=np.int32), counts)
            first_rows = np.zeros(self.max_num_seqs, np.int32)
            first_rows[:N] = np.cumsum(counts) - counts
            totals, firsts = self._pool(hidden, segments, first_rows)
        batch.num_computed_tokens[rows] += counts
        self._check_recompilation()
        return AsyncPoolingOutput(self, req_ids, starts, counts, inputs.commit, last, totals, firsts,
                                  hidden if "ALL" in kinds else None)

    def pooled_output(self, pending: AsyncPoolingOutput) -> ModelRunnerOutput:
        """Accumulates the step's rows into each request's pooling state; the requests whose
        prompt the step finished get their output."""
        N = len(pending.req_ids)
        last, totals, firsts, hidden = (None if x is None else np.asarray(x) for x in
                                        (pending.last, pending.totals, pending.firsts, pending.hidden))
        ends = np.cumsum(pending.counts)
        done = []
        for i, req_id in enumerate(pending.req_ids):
            state = self.pooling.get(req_id)
            if state is None:
                continue  # dropped meanwhile
            start, count = int(pending.starts[i]), int(pending.counts[i])
            state.add_chunk(start, count, last[i], None if totals is None else totals[i],
                            None if firsts is None else firsts[i],
                            None if hidden is None else hidden[ends[i] - count:ends[i]])
            if pending.finishing[i]:
                done.append(i)
        outputs: list[list | None] = [None] * N
        if done:
            states = [self.pooling.pop(pending.req_ids[i]) for i in done]
            results = self._finish([s.pooled() for s in states], [s.params for s in states])
            for i, result in zip(done, results):
                outputs[i] = result.tolist()
        return ModelRunnerOutput(pending.req_ids, [[] for _ in range(N)], pooler_output=outputs)

    def _finish(self, pooled: list[np.ndarray], params) -> list[np.ndarray]:
        if self.convert == "embed":
            return [embedding(p, q) for p, q in zip(pooled, params)]
        single = [p for p in pooled if p.ndim == 1]
        logits = iter(self._logits(np.stack(single)) if single else ())
        return [classification(next(logits) if p.ndim == 1 else self._logits(p), q)
                for p, q in zip(pooled, params)]

    def _logits(self, pooled: np.ndarray) -> np.ndarray:
        """The score head over pooled rows, in request-bucket batches."""
        out = []
        for start in range(0, len(pooled), self.max_num_seqs):
            rows = pooled[start:start + self.max_num_seqs]
            R = pick_bucket(self.request_buckets, len(rows))
            padded = np.zeros((R, rows.shape[1]), self.hidden_dtype)
            padded[:len(rows)] = rows
            out.append(np.asarray(self._classify(self.head_leaves, padded))[:len(rows)])
        return np.concatenate(out)

    # ---- compile discipline --------------------------------------------------------
    @property
    def programs(self):
        return (self._forward, self._pool, self._classify)

    def warmup_jobs(self):
        rep, S, H = self._replicated, self.max_num_seqs, self.hidden_size
        jobs = [job for job in super().warmup_jobs() if job[0] is self._forward]
        for T in self.token_buckets:
            hidden = jax.ShapeDtypeStruct((T, H), self.hidden_dtype, sharding=rep)
            jobs.append((self._pool, (hidden, np.zeros(T, np.int32), np.zeros(S, np.int32)), {}))
        if self.convert == "classify":
            jobs += [(self._classify, (self.head_leaves, np.zeros((R, H), self.hidden_dtype)), {})
                     for R in self.request_buckets]
        return jobs
