"""DistributedExecutorBase (vLLM's name): the Worker's interface, for the EngineCore, over
workers in other processes. Every call is one `collective_rpc(method, args)` to all of
them, which the subclass carries (ZMQ to worker processes, or Ray actors)."""
from __future__ import annotations

import os
import tempfile

from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.transformers_utils.weights_dir import write_weights_dir


class DistributedExecutorBase:
    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run `method(*args)` on every worker; their results in rank order."""
        raise NotImplementedError

    def determine_num_blocks(self) -> int:
        return min(self.collective_rpc("determine_num_blocks"))

    def initialize_cache(self, num_blocks: int, num_swap_blocks: int = 0) -> None:
        """num_swap_blocks is always 0 here (EngineConfig.verify refuses swap with workers in
        other processes)."""
        self.collective_rpc("initialize_cache", (num_blocks,))

    def execute_model(self, scheduler_output) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,))[0]

    @property
    def num_compilations(self) -> int:
        return self.collective_rpc("get_num_compilations")[0]

    def update_weights(self, weights) -> None:
        """weights: a path every worker can read, or {name: array}, which crosses to the
        workers as a temporary safetensors directory on this host: each worker reads its own
        shards of it (so with Ray, a one-host cluster)."""
        if isinstance(weights, (str, os.PathLike)):
            self.collective_rpc("update_weights", (os.fspath(weights),))
            return
        with tempfile.TemporaryDirectory(prefix="jaxvllm-weights-") as path:
            write_weights_dir(weights, path)
            self.collective_rpc("update_weights", (path,))
