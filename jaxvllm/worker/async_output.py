"""A dispatched step whose sampled tokens are still on their way to the host (vLLM's
`AsyncModelRunnerOutput`; tpu-inference's `AsyncTPUModelRunnerOutput`).

The runner starts the device-to-host copy as soon as it dispatches the sampler and returns
this at once; `get_output` waits for the copy, writes the tokens into the persistent batch's
rows and builds the `ModelRunnerOutput`. With async scheduling the engine calls it one step
later, after dispatching the next step, whose inputs read these tokens on device.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax
import numpy as np

from jaxvllm.outputs import LogprobsLists, ModelRunnerOutput
from jaxvllm.worker.input_batch import InputBatch
from jaxvllm.worker.logprobs import sampled_logprobs


@dataclass
class AsyncModelRunnerOutput:
    batch: InputBatch
    req_ids: list[str]
    rows: np.ndarray         # i32[N]: each request's batch row
    commit: np.ndarray       # bool[N]: it samples a kept token
    generation: np.ndarray   # i64[N]: each row's owner at dispatch (a late token skips a new owner)
    sampled: jax.Array | np.ndarray  # i32[R]
    logprobs: tuple | None = None  # the extended sampler's (device) logprobs arrays
    num_logprobs: np.ndarray | None = None  # i32[N]: k asked for, -1 for none
    prompt_logprobs: dict[str, LogprobsLists] = field(default_factory=dict)
    on_ready: object = None  # called once the tokens are back (the runner's first-step hook)

    def __post_init__(self) -> None:
        for x in (self.sampled,) + tuple(self.logprobs or ()):
            if isinstance(x, jax.Array):
                x.copy_to_host_async()

    def get_output(self) -> ModelRunnerOutput:
        N = len(self.req_ids)
        sampled = np.asarray(self.sampled)[:N]
        batch, rows, commit = self.batch, self.rows, self.commit
        if self.on_ready is not None:
            self.on_ready()
        if commit.all():
            kept_rows, kept = rows, sampled
            generation = self.generation
            token_lists = [[t] for t in sampled.tolist()]
        else:
            kept_rows, kept = rows[commit], sampled[commit]
            generation = self.generation[commit]
            token_lists = [[t] if c else [] for t, c in zip(sampled.tolist(), commit.tolist())]
        # Rows dropped meanwhile and taken by another request are not written.
        owned = batch.generation[kept_rows] == generation
        if not owned.all():
            kept_rows, kept = kept_rows[owned], kept[owned]
        batch.token_ids[kept_rows, batch.num_host_tokens[kept_rows]] = kept
        batch.num_host_tokens[kept_rows] += 1
        logprobs = None
        if self.logprobs is not None:
            logprobs = sampled_logprobs(self.num_logprobs, commit, sampled,
                                        jax.device_get(self.logprobs))
        return ModelRunnerOutput(self.req_ids, token_lists, logprobs, self.prompt_logprobs)
