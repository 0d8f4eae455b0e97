"""Executors: how the engine drives its workers (vLLM's executor/): in this process, one
process per device, or Ray actors, all through the same collective_rpc."""
from __future__ import annotations

from jaxvllm.config import EngineConfig
from jaxvllm.executor.abstract import Executor


def get_executor_class(config: EngineConfig) -> type[Executor]:
    """The executor `distributed_executor_backend` names (vLLM's Executor.get_class)."""
    backend = config.parallel.distributed_executor_backend
    if backend == "mp":
        from jaxvllm.executor.multiproc import MultiprocExecutor
        return MultiprocExecutor
    if backend == "ray":
        from jaxvllm.executor.ray_executor import RayDistributedExecutor
        return RayDistributedExecutor
    from jaxvllm.executor.uniproc import UniProcExecutor
    return UniProcExecutor
