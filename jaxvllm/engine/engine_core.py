"""EngineCore: the busy loop's body. Schedule, execute, update; nothing else.

It owns the scheduler (host) and an Executor (device: the Worker in this process, worker
processes or Ray actors, all behind executor/abstract.py's interface), sizes the KV cache
from the specs the workers report, and sees requests only as EngineCoreRequests, so the
same core runs in process or in its own process behind ZMQ.
"""
from __future__ import annotations

import logging
import os

import jax

from jaxvllm.config import EngineConfig
from jaxvllm.core.kv_cache_interface import KVCacheConfig, get_kv_cache_config
from jaxvllm.core.request import Request
from jaxvllm.core.sched_output import SchedulerOutput
from jaxvllm.core.scheduler import Scheduler
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.core.structured_output import StructuredOutputManager
from jaxvllm.engine.batch_queue import BatchQueue
from jaxvllm.engine.exceptions import EngineSleepingError
from jaxvllm.engine.messages import EngineCoreRequest
from jaxvllm.executor import get_executor_class
from jaxvllm.executor.abstract import Executor
from jaxvllm.executor.multihost import SchedulerOutputBroadcaster
from jaxvllm.kv_transfer.jax_transfer_connector import check_kv_transfer_params
from jaxvllm.outputs import EngineCoreOutput
from jaxvllm.sampling_params import is_int
from jaxvllm.transformers_utils.tokenizer import load_tokenizer
from jaxvllm.worker.async_output import AsyncModelRunnerOutput

logger = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, executor_class: type[Executor] | None = None):
        """executor_class: default the one config.parallel names (executor/__init__.py)."""
        self.config = config
        if config.parallel.node_rank > 0:
            raise ValueError("The EngineCore runs on node_rank 0 only; other hosts run "
                             "jaxvllm.executor.multihost.run_follower.")
        self.model_executor = (executor_class or get_executor_class(config))(config)
        kv_cache_config = self._initialize_kv_caches()
        self.num_kv_groups = len(kv_cache_config.kv_cache_groups)
        hf_config = config.model.hf_config
        self.scheduler = Scheduler(
            config.scheduler, config.cache, kv_cache_config, model_name=config.model.name,
            structured_output_manager=StructuredOutputManager(lambda: load_tokenizer(config.model.path),
                                                              hf_config.vocab_size),
            max_concurrent_batches=self.model_executor.max_concurrent_batches,
            num_spec_tokens=config.speculative.num_speculative_tokens if config.speculative else 0,
            num_lookahead_tokens=(config.speculative.num_speculative_tokens
                                  if config.speculative and config.speculative.model is not None else 0),
            use_eagle=config.speculative is not None and config.speculative.method == "eagle3",
            max_loras=config.lora.max_loras if config.lora is not None else 0, engine_config=config)
        self.vocab_size = hf_config.vocab_size
        # Async scheduling: the step dispatched last, whose tokens are read after the next
        # one is dispatched.
        self.async_scheduling = config.scheduler.async_scheduling
        self._in_flight: tuple[SchedulerOutput, AsyncModelRunnerOutput] | None = None
        # Pipeline parallelism: a batch in flight per stage (vLLM's virtual engines).
        pp = config.parallel.pipeline_parallel_size
        self.batch_queue = BatchQueue(pp) if pp > 1 else None
        self.step_num = 0
        self.profiling = False
        self.sleeping_tags: set[str] = set()

    def _initialize_kv_caches(self) -> KVCacheConfig:
        """The workers report their layers' KV cache specs and the memory they offer; the
        pool is sized from both (core/kv_cache_interface.py), and every worker allocates it.
        Workers hold the same layers (tensor parallel) or report every stage's (pipeline)."""
        c = self.config.cache
        specs = self.model_executor.get_kv_cache_specs()[0]
        available = (None if c.num_gpu_blocks_override is not None
                     else self.model_executor.determine_available_memory())
        # Host slots for swap preemption, sized like the device blocks they hold.
        swap_bytes = int(c.swap_space * 2**30) if self.config.scheduler.preemption_mode == "swap" else 0
        kv_cache_config = get_kv_cache_config(specs, available, num_gpu_blocks_override=c.num_gpu_blocks_override,
                                              swap_space_bytes=swap_bytes,
                                              max_model_len=self.config.scheduler.max_model_len,
                                              max_num_batched_tokens=self.config.scheduler.max_num_batched_tokens)
        # Multi-host: the other processes replay this one's schedule on the global mesh.
        self.broadcaster = (SchedulerOutputBroadcaster(self.config.parallel)
                            if self.config.parallel.nnodes > 1 else None)
        if self.broadcaster is not None:
            self.broadcaster.send_kv_cache_config(kv_cache_config)
        self.model_executor.initialize_from_config(kv_cache_config)
        return kv_cache_config

    def add_request(self, request: EngineCoreRequest) -> None:
        """Raises ValueError for a request this engine cannot hold; the front end checks the
        same limits, but the engine protects itself from any client of its socket."""
        if self.sleeping_tags:
            raise EngineSleepingError()
        if request.request_id in self.scheduler.requests:
            raise ValueError(f"Request id {request.request_id!r} is already running.")
        ids, vocab = request.prompt_token_ids, self.vocab_size
        if not ids or len(ids) >= self.config.scheduler.max_model_len:
            raise ValueError(f"prompt_token_ids must hold 1 to {self.config.scheduler.max_model_len - 1} "
                             f"tokens, got {len(ids)}.")
        if not all(is_int(t) and 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt_token_ids must lie in [0, {vocab}).")
        if not (is_int(request.priority) and -2**63 <= request.priority < 2**63):
            raise ValueError("priority must be a 64-bit integer.")
        if (request.pooling_params is not None) != (self.config.model.runner == "pooling"):
            raise ValueError(f"This engine runs runner={self.config.model.runner!r}: it takes "
                             f"{'pooling' if self.config.model.runner == 'pooling' else 'sampling'}_params.")
        if request.lora_request is not None and self.config.lora is None:
            raise ValueError("lora_request needs an engine started with enable_lora=True.")
        if request.sampling_params is not None:
            check_kv_transfer_params(self.config, request.sampling_params.kv_transfer_params, len(ids),
                                     self.num_kv_groups)
        self.scheduler.add_request(Request(
            request_id=request.request_id, prompt_token_ids=request.prompt_token_ids,
            sampling_params=request.sampling_params, eos_token_id=request.eos_token_id,
            sampling_seed=request.sampling_seed, arrival_time=request.arrival_time,
            priority=request.priority, cache_salt=request.cache_salt, pooling_params=request.pooling_params,
            lora_request=request.lora_request))

    def abort_requests(self, request_ids) -> None:
        self.scheduler.abort_requests(request_ids)
        if self._in_flight is not None and not self.scheduler.has_unfinished_requests():
            self._finish(self._in_flight)  # tokens of finished requests only: dropped
            self._in_flight = None
        if self.batch_queue and not self.scheduler.has_unfinished_requests():
            self.batch_queue.drain(self._finish)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def get_stats(self) -> SchedulerStats:
        stats = self.scheduler.make_stats()
        stats.num_compilations = self.model_executor.num_compilations
        return stats

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished_requests() or self._in_flight is not None
                or bool(self.batch_queue))

    def step(self) -> list[EngineCoreOutput]:
        # Named spans so that a jax.profiler trace shows host and device time per step.
        if self.batch_queue is not None:
            return self.batch_queue.step(self.scheduler, self._dispatch, self._finish)
        if self.async_scheduling:
            return self._step_async()
        if not self.scheduler.has_unfinished_requests():
            return []
        self.step_num += 1
        with jax.profiler.StepTraceAnnotation("engine_step", step_num=self.step_num):
            with jax.profiler.TraceAnnotation("schedule"):
                scheduler_output = self.scheduler.schedule()
            if self.broadcaster is not None:
                self.broadcaster.send(scheduler_output)
            runner_output = self.model_executor.execute_model(scheduler_output)
            with jax.profiler.TraceAnnotation("update_from_output"):
                return self.scheduler.update_from_output(scheduler_output, runner_output)

    def _step_async(self) -> list[EngineCoreOutput]:
        """Dispatch step n + 1, then read step n's tokens while the device runs it. The
        scheduler counted step n's tokens as placeholders; a request that step n finishes
        (EOS, max_tokens, a stop string found by the front end) had one more token computed
        in step n + 1, which update_from_output drops: it is never emitted."""
        outputs = []
        sync = bool(self.scheduler.host_token_req_ids)  # their next step needs the last token
        if sync and self._in_flight is not None:
            outputs = self._finish(self._in_flight)
            self._in_flight = None
        previous = self._in_flight
        self._in_flight = self._dispatch() if self.scheduler.has_unfinished_requests() else None
        if previous is not None:
            outputs += self._finish(previous)
        # Nothing left to overlap (every request finished with step n), or the next step
        # needs this one's tokens: wait for them now.
        if self._in_flight is not None and (self.scheduler.host_token_req_ids
                                            or not self.scheduler.has_unfinished_requests()):
            outputs += self._finish(self._in_flight)
            self._in_flight = None
        return outputs

    def _dispatch(self) -> tuple[SchedulerOutput, AsyncModelRunnerOutput]:
        self.step_num += 1
        with jax.profiler.StepTraceAnnotation("engine_step", step_num=self.step_num):
            with jax.profiler.TraceAnnotation("schedule"):
                scheduler_output = self.scheduler.schedule()
            return scheduler_output, self.model_executor.execute_model_async(scheduler_output)

    def _finish(self, step: tuple[SchedulerOutput, AsyncModelRunnerOutput]) -> list[EngineCoreOutput]:
        scheduler_output, pending = step
        runner_output = pending.get_output()
        with jax.profiler.TraceAnnotation("update_from_output"):
            return self.scheduler.update_from_output(scheduler_output, runner_output)

    def shutdown(self) -> None:
        self.model_executor.shutdown()
        if self.broadcaster is not None:
            self.broadcaster.close()  # the followers' loops end
            self.broadcaster = None

    # ---- sleep mode and weight updates (every worker, by collective_rpc) -------------
    def sleep(self, level: int = 1) -> None:
        """Free the device for another job (worker/worker.py: level 1 keeps the weights in
        host memory, level 2 drops them). vLLM leaves requests in flight to the caller; here
        sleeping with any is refused, naming them, so none is lost."""
        if level not in (1, 2):
            raise ValueError(f"sleep level must be 1 or 2, got {level!r}.")
        self._refuse_in_flight("sleep")
        self.scheduler.reset_prefix_cache()  # the KV pages it names are about to go
        self.model_executor.collective_rpc("sleep", (level,))
        self.sleeping_tags = {"weights", "kv_cache"}

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Restore the weights and/or the KV cache (default both); returns is_sleeping()."""
        self._check_single_host("wake_up")
        self.model_executor.collective_rpc("wake_up", (tags,))
        self.sleeping_tags -= {"weights", "kv_cache"} if tags is None else set(tags)
        return self.is_sleeping()

    def is_sleeping(self) -> bool:
        return bool(self.sleeping_tags)

    def update_weights(self, weights) -> bool:
        """New weights ({name: array} or a path), between steps, with no request in flight
        (their KV pages came from the old weights); a bad update changes nothing. Returns
        is_sleeping() (an update wakes the weights, not the KV cache)."""
        self._refuse_in_flight("update_weights")
        self.model_executor.update_weights(weights)
        self.sleeping_tags.discard("weights")
        self.scheduler.reset_prefix_cache()
        return self.is_sleeping()

    def device_memory_in_use(self) -> int:
        """Bytes the engine's devices hold (worker/sleep_mode.py), summed over the workers."""
        return sum(self.model_executor.collective_rpc("device_memory_in_use"))

    def _refuse_in_flight(self, what: str) -> None:
        self._check_single_host(what)
        if self.scheduler.requests:
            ids = sorted(self.scheduler.requests)
            raise RuntimeError(f"Cannot {what} with {len(ids)} request(s) in flight "
                               f"({', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}); "
                               f"let them finish or abort them first.")

    def _check_single_host(self, what: str) -> None:
        if self.broadcaster is not None:
            raise ValueError(f"{what} is not supported with nnodes > 1.")

    # ---- profiling ----------------------------------------------------------------
    def start_profile(self, profile_dir: str | None = None) -> str:
        """Start a jax.profiler trace into profile_dir (else the engine's profile_dir)."""
        profile_dir = profile_dir or self.config.profile_dir
        if not profile_dir:
            raise ValueError("No profile directory: set profile_dir (--profile-dir) or pass one.")
        if self.profiling:
            raise ValueError("A profile is already being captured; stop it first.")
        os.makedirs(profile_dir, exist_ok=True)
        jax.profiler.start_trace(profile_dir)
        self.profiling = True
        return profile_dir

    def stop_profile(self) -> None:
        if not self.profiling:
            raise ValueError("No profile is being captured; start one first.")
        jax.block_until_ready(self.model_executor.kv_cache)  # the last step's device work
        jax.profiler.stop_trace()
        self.profiling = False
