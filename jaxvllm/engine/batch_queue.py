"""BatchQueue: pipeline parallelism's virtual engines (vLLM V1's EngineCore batch queue,
`step_with_batch_queue`, `max_concurrent_batches` = pipeline_parallel_size).

With one batch in the pipeline, stage s idles while the others compute. Here the engine
schedules and dispatches batch n + 1 before it reads batch n's tokens, up to `size` batches
in flight, so that stage 0 runs batch n + 1 while the last stage runs batch n (JAX's
dispatch returns at once; each stage's programs queue on its own devices). The batches hold
different requests (the scheduler's `max_concurrent_batches`), so no batch waits for another's
tokens, and their outputs are applied in dispatch order.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.core.scheduler import Scheduler
from jaxvllm.outputs import EngineCoreOutput
from jaxvllm.worker.async_output import AsyncModelRunnerOutput

Batch = tuple[SchedulerOutput, AsyncModelRunnerOutput]


class BatchQueue:
    def __init__(self, size: int):
        self.size = size
        self.batches: deque[Batch] = deque()  # newest first
        self.max_in_flight = 0  # the most batches dispatched and not yet read, at once

    def __len__(self) -> int:
        return len(self.batches)

    def step(self, scheduler: Scheduler, dispatch: Callable[[], Batch],
             finish: Callable[[Batch], list[EngineCoreOutput]]) -> list[EngineCoreOutput]:
        """Dispatch a batch if any request can run; read the oldest batch's tokens once the
        queue is full, or when nothing new could be scheduled (its requests are all in
        flight, or none is left)."""
        if scheduler.has_unfinished_requests():
            batch = dispatch()  # an empty one still tells the worker which requests finished
            if batch[0].total_num_scheduled_tokens:
                self.batches.appendleft(batch)
                self.max_in_flight = max(self.max_in_flight, len(self.batches))
                if len(self.batches) < self.size:
                    return []
        return finish(self.batches.pop()) if self.batches else []

    def drain(self, finish: Callable[[Batch], list[EngineCoreOutput]]) -> list[EngineCoreOutput]:
        """Read every batch in flight, oldest first."""
        outputs = []
        while self.batches:
            outputs += finish(self.batches.pop())
        return outputs
