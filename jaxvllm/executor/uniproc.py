"""UniProcExecutor: the Worker in the engine's own process, which drives all local devices
(JAX's way on one host). It has MultiprocExecutor's interface, so the EngineCore drives
either the same way; here every call is a plain method call on the Worker."""
from __future__ import annotations

from jaxvllm.config import EngineConfig
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.worker.pipeline_worker import PipelineWorker
from jaxvllm.worker.worker import Worker


class UniProcExecutor:
    def __init__(self, config: EngineConfig, model_path: str, hf_config):
        worker_cls = PipelineWorker if config.parallel.pipeline_parallel_size > 1 else Worker
        self.driver_worker = worker_cls(config, model_path, hf_config)

    # ---- the Worker's interface, for the EngineCore -----------------------------------
    def determine_num_blocks(self) -> int:
        return self.driver_worker.determine_num_blocks()

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block, which size the host slots of swap preemption (only this
        executor swaps: EngineConfig.verify refuses swap with the "mp" one)."""
        return self.driver_worker.block_bytes

    def initialize_cache(self, num_blocks: int, num_swap_blocks: int = 0) -> None:
        self.driver_worker.initialize_cache(num_blocks, num_swap_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.driver_worker.execute_model(scheduler_output)

    @property
    def num_compilations(self) -> int:
        return self.driver_worker.get_num_compilations()

    @property
    def kv_cache(self):
        """The KV cache, for waiting on the last step's device work (profiling)."""
        return self.driver_worker.model_runner.kv_cache

    def update_weights(self, weights) -> None:
        """weights: {name: array} (jax arrays used as they are) or a path."""
        self.collective_rpc("update_weights", (weights,))

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run `method(*args)` on the one worker; its result in a list, as for several."""
        return [getattr(self.driver_worker, method)(*args)]

    def shutdown(self) -> None:
        """Nothing to stop: the Worker lives and ends with this process."""
