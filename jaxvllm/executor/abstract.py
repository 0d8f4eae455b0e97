"""Executor: what the EngineCore drives its workers through (vLLM's v1/executor/abstract.py).
Every executor implements it (uniproc: the Worker in this process; multiproc: worker
processes; ray: Ray actors) and the EngineCore uses nothing else: every call is
`collective_rpc(method, args)` on all workers, which each subclass carries its own way.

WORKER_METHODS is the one whitelist of Worker methods an executor may call, with the types
their arguments and results are decoded into where they cross a process (msgpack).
"""
from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod

from jaxvllm.config import EngineConfig
from jaxvllm.core.kv_cache_interface import KVCacheConfig, KVCacheSpec
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.outputs import ModelRunnerOutput
from jaxvllm.transformers_utils.weights_dir import write_weights_dir

WORKER_METHODS = {
    "get_kv_cache_spec": (None, dict[str, KVCacheSpec]),
    "determine_available_memory": (None, int),
    "initialize_from_config": (tuple[KVCacheConfig], None),
    "execute_model": (tuple[SchedulerOutput], ModelRunnerOutput),
    "get_num_compilations": (None, int),
    "sleep": (tuple[int], None),
    "wake_up": (tuple[list[str] | None], None),
    "update_weights": (tuple[str], None),
    "device_memory_in_use": (None, int),
}
# Methods whose ValueError is a refused argument (a tensor of the wrong shape, an unknown
# tag), checked before anything changes: the caller gets it and the engine goes on.
REFUSABLE = ("sleep", "wake_up", "update_weights")


class WorkerDiedError(RuntimeError):
    pass


def check_method(method: str) -> None:
    if method not in WORKER_METHODS:
        raise ValueError(f"Unknown worker method {method!r}.")


class _Completed:
    """A step whose tokens are already back (executors without async output)."""

    def __init__(self, output: ModelRunnerOutput):
        self.output = output

    def get_output(self) -> ModelRunnerOutput:
        return self.output


class Executor(ABC):
    def __init__(self, config: EngineConfig):
        self.config = config
        self._init_executor()

    @abstractmethod
    def _init_executor(self) -> None:
        """Start the workers (each builds its Worker from self.config)."""

    @abstractmethod
    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run the Worker's `method(*args)` on every worker; their results in rank order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers; nothing outlives the engine."""

    # ---- the KV cache: specs reported, memory offered, the pool allocated ------------
    def get_kv_cache_specs(self) -> list[dict[str, KVCacheSpec]]:
        return self.collective_rpc("get_kv_cache_spec")

    def determine_available_memory(self) -> int:
        """KV cache bytes every worker can hold (each worker's budget over its mesh)."""
        return min(self.collective_rpc("determine_available_memory"))

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.collective_rpc("initialize_from_config", (kv_cache_config,))

    # ---- steps ------------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", (scheduler_output,))[0]

    def execute_model_async(self, scheduler_output: SchedulerOutput):
        """The step dispatched; `.get_output()` reads its tokens. Only an executor whose
        worker is in this process returns before they are back (async scheduling)."""
        return _Completed(self.execute_model(scheduler_output))

    @property
    def max_concurrent_batches(self) -> int:
        """Batches in flight at once: one per pipeline stage (engine/batch_queue.py)."""
        return self.config.parallel.pipeline_parallel_size

    @property
    def num_compilations(self) -> int:
        return self.collective_rpc("get_num_compilations")[0]

    @property
    def kv_cache(self):
        """The KV cache where it lives in this process (to wait on the last step's device
        work when a profile stops); None where it lives in the workers."""
        return None

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
