"""RayDistributedExecutor: the model in Ray actors (executor/ray_worker.py), one per host or
device group, placed by a placement group and joined into one mesh by jax.distributed,
driven by the same `collective_rpc(method, args)` as MultiprocExecutor.

- The cluster: the one RAY_ADDRESS names, else a local one started here (and stopped at
  shutdown, so that no Ray process outlives the engine).
- Placement: `ray_workers` bundles of the platform's resources (platforms/), spread over the
  cluster's nodes where it has several.
- Failures: results are awaited in 0.1 s slices; a dead actor (its process killed, its node
  lost) fails the call with WorkerDiedError naming it, and the engine with it.
"""
from __future__ import annotations

import logging
import os

from jaxvllm import platforms
from jaxvllm.config import EngineConfig
from jaxvllm.executor.abstract import REFUSABLE, WORKER_METHODS, Executor, WorkerDiedError, check_method
from jaxvllm.executor.ray_worker import RayWorkerWrapper
from jaxvllm.serial_utils import decode, encode

logger = logging.getLogger(__name__)
_POLL_S = 0.1


class RayDistributedExecutor(Executor):
    def _init_executor(self) -> None:
        config = self.config
        try:
            import ray
        except ImportError:
            raise ValueError("distributed_executor_backend='ray' needs Ray: "
                             "pip install 'jaxvllm[ray]'.") from None
        self.ray = ray
        self.failure: str | None = None
        self._closing = False
        self.world_size = config.parallel.ray_workers
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            ray.init(**({} if os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}))
        self.workers, self.placement_group = [], None
        try:
            self._start_workers(config)
        except BaseException:
            self.shutdown()
            raise

    def _start_workers(self, config: EngineConfig) -> None:
        ray = self.ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        platform = platforms.current_platform
        per_worker = config.parallel.tensor_parallel_size // self.world_size
        resources = platform.ray_worker_resources(per_worker)
        self.placement_group = placement_group([resources] * self.world_size, strategy="SPREAD")
        ray.get(self.placement_group.ready())
        actor = ray.remote(RayWorkerWrapper)
        env = {**platform.worker_device_env(per_worker),
               **{k: os.environ[k] for k in ("PYTHONPATH", "JAXVLLM_XLA_CACHE") if k in os.environ}}
        self.workers = [actor.options(
            num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
            resources={k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
            max_restarts=0, runtime_env={"env_vars": env},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                self.placement_group, placement_group_bundle_index=rank)).remote()
            for rank in range(self.world_size)]
        self.worker_pids = self._wait([w.pid.remote() for w in self.workers], "start")
        coordinator = self._wait([self.workers[0].node_address.remote()], "start")[0]
        self._wait([w.init_worker.remote(encode(config), rank, self.world_size, coordinator)
                    for rank, w in enumerate(self.workers)], "init_worker")

    # ---- RPC ------------------------------------------------------------------------
    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        """Run `method(*args)` on every worker; their results in rank order. Raises
        WorkerDiedError once any worker has died or failed."""
        check_method(method)
        if self.failure is not None:
            raise WorkerDiedError(self.failure)
        payload = encode(list(args))
        results = self._wait([w.execute_method.remote(method, payload) for w in self.workers], method)
        refused = next((r for r in results if isinstance(r, ValueError)), None)
        if refused is not None:
            raise refused
        kind = WORKER_METHODS[method][1]
        return [None if kind is None else decode(kind, r) for r in results]

    def _wait(self, refs: list, what: str) -> list:
        ray = self.ray
        pending = {ref: rank for rank, ref in enumerate(refs)}
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_S)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    ray.get(ref)
                except ray.exceptions.RayActorError as e:
                    self._fail(f"Ray worker {rank} died during {what}; the engine cannot "
                               f"continue. ({type(e).__name__})")
                except ray.exceptions.RayTaskError as e:
                    if not (isinstance(e.cause, ValueError) and what in REFUSABLE):
                        self._fail(f"Ray worker {rank} failed in {what}: {e.cause!r}")
        # A refused argument (checked before anything changed) goes back to the caller.
        return [_result_or_refusal(ray, ref) for ref in refs]

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
            logger.error("%s", reason)
        raise WorkerDiedError(reason)

    def shutdown(self) -> None:
        """Kill the actors, free their placement group, and stop the cluster this executor
        started: nothing of Ray outlives the engine."""
        if self._closing:
            return
        self._closing = True
        ray = self.ray
        for w in self.workers:
            ray.kill(w, no_restart=True)
        if self.placement_group is not None:
            ray.util.remove_placement_group(self.placement_group)
        if self._owns_ray:
            ray.shutdown()


def _result_or_refusal(ray, ref):
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        return ValueError(str(e.cause))
