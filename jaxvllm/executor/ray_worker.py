"""RayWorkerWrapper: the Ray actor that holds one Worker (vLLM's name). One per host or
device group; all of them join one mesh with jax.distributed, each driving its own devices
(made visible by its placement-group bundle, or simulated on a CPU: platforms/).

Calls arrive as (method, msgpack bytes) and results leave as msgpack bytes, the same
messages MultiprocExecutor's workers exchange (executor/abstract.WORKER_METHODS): Ray carries
only bytes, nothing of ours is pickled. JAX is imported only inside the actor.
"""
from __future__ import annotations

import os
import socket

from jaxvllm.serial_utils import decode, encode


class RayWorkerWrapper:
    def __init__(self):
        self.worker = None

    def node_address(self) -> str:
        """Where the jax.distributed coordinator (rank 0's) listens: this node, a free port."""
        import ray
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{ray.util.get_node_ip_address()}:{port}"

    def pid(self) -> int:
        return os.getpid()

    def init_worker(self, config_bytes: bytes, rank: int, world_size: int, coordinator: str) -> None:
        import jax

        from jaxvllm.config import EngineConfig
        from jaxvllm.worker.worker import Worker

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=world_size,
                                   process_id=rank)
        self.worker = Worker(decode(EngineConfig, config_bytes))

    def execute_method(self, method: str, payload: bytes) -> bytes:
        from jaxvllm.executor.abstract import WORKER_METHODS, check_method
        check_method(method)
        arg_types, result_type = WORKER_METHODS[method]
        result = getattr(self.worker, method)(*(decode(arg_types, payload) if arg_types else ()))
        return b"" if result_type is None else encode(result)
