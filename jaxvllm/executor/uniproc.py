"""UniProcExecutor: the Worker in the engine's own process, which drives all local devices
(JAX's way on one host). Every collective_rpc is a plain method call on the Worker; weights
given as arrays go to it as they are, and a step can be dispatched before its tokens are
back (async scheduling, the pipeline's batch queue)."""
from __future__ import annotations

from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.executor.abstract import Executor, check_method
from jaxvllm.worker.async_output import AsyncModelRunnerOutput
from jaxvllm.worker.pipeline_worker import PipelineWorker
from jaxvllm.worker.worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        worker_cls = PipelineWorker if self.config.parallel.pipeline_parallel_size > 1 else Worker
        self.driver_worker = worker_cls(self.config)

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run `method(*args)` on the one worker; its result in a list, as for several."""
        check_method(method)
        return [getattr(self.driver_worker, method)(*args)]

    def execute_model_async(self, scheduler_output: SchedulerOutput) -> AsyncModelRunnerOutput:
        return self.driver_worker.execute_model_async(scheduler_output)

    @property
    def kv_cache(self):
        return self.driver_worker.model_runner.kv_cache

    def update_weights(self, weights) -> None:
        """weights: {name: array} (jax arrays used as they are) or a path."""
        self.collective_rpc("update_weights", (weights,))

    def shutdown(self) -> None:
        """The Worker lives and ends with this process; its background work stops now."""
        self.driver_worker.shutdown()
