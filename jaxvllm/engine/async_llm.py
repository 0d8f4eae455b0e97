"""AsyncLLM: the asyncio front end that the server (and notebooks) stream from.

Tokenizing and detokenizing run here while the EngineCore steps in its own process.
One background task, the output handler, pulls EngineCoreOutputs off the socket,
detokenizes them and hands each request's output to its collector; `generate` is an
async iterator over that collector. Leaving the iterator early aborts the request.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import AsyncIterator

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.engine.core_client import AsyncMPClient
from jaxvllm.engine.dp_client import DPAsyncMPClient
from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.engine.output_processor import OutputProcessor, RequestOutputCollector
from jaxvllm.engine.parallel_sampling import ParentRequest
from jaxvllm.engine.processor import Processor, eos_token_id
from jaxvllm.engine.sleep_state import SleepStage, SleepState, check_sleep_level
from jaxvllm.metrics.stats import IterationStats
from jaxvllm.outputs import RequestOutput
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.model_path import resolve_model
from jaxvllm.transformers_utils.tokenizer import load_tokenizer

logger = logging.getLogger(__name__)


OUTPUT_CHUNK_SIZE = 128  # outputs processed between two turns of the event loop


class AsyncLLM:
    def __init__(self, args: EngineArgs, stat_loggers=None):
        model_path = resolve_model(args.model, args.revision, args.download_dir)
        self.model_config = hf_config = load_hf_config(model_path)
        self.tokenizer = tokenizer = load_tokenizer(model_path)
        # The engine process loads what was resolved here (a Hub id is fetched once).
        args = dataclasses.replace(args, model=model_path)
        self.engine_core = (DPAsyncMPClient(args) if args.data_parallel_size > 1
                            else AsyncMPClient(args))
        self.vllm_config: EngineConfig = self.engine_core.config
        self.model_name = args.model or model_path
        self.processor = Processor(self.vllm_config, tokenizer, hf_config.vocab_size,
                                   eos_token_id(tokenizer, hf_config))
        self.output_processor = OutputProcessor(tokenizer)
        self.stat_loggers = list(stat_loggers or [])
        self.last_scheduler_stats: SchedulerStats | None = None
        self._output_handler: asyncio.Task | None = None
        self._errored_with: Exception | None = None
        self._children: dict[str, list[str]] = {}  # request id -> its engine request ids
        self.sleep_state = SleepState()  # as the last sleep / wake_up / update_weights left it
        self._sleep_lock = asyncio.Lock()  # one transition at a time

    @classmethod
    def from_engine_args(cls, args: EngineArgs, stat_loggers=None) -> "AsyncLLM":
        return cls(args, stat_loggers)

    # ---- requests -----------------------------------------------------------------
    async def generate(self, prompt, sampling_params: SamplingParams, request_id: str,
                       priority: int = 0, lora_request=None) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs until it finishes; ValueError for invalid input
        (before anything is queued), EngineDeadError if the engine process dies.
        With n > 1 the request fans out into n children (parallel_sampling.py) whose
        completions come back together, each with its index."""
        self._ensure_output_handler()
        if self.errored:
            raise EngineDeadError()
        self.sleep_state.check_admits()
        collector = RequestOutputCollector(sampling_params.output_kind)
        parent = ParentRequest.from_params(request_id, sampling_params)
        children = (parent.child_requests() if parent is not None
                    else [(request_id, sampling_params)])
        # Tokenizing and compiling a grammar can take long for large inputs: not on the loop.
        processed = await asyncio.to_thread(lambda: [
            self.processor.process_inputs(child_id, prompt, params, priority=priority,
                                          lora_request=lora_request)
            for child_id, params in children])
        requests, child_ids = [], []
        self.sleep_state.check_admits()  # /sleep may have begun while this was tokenized
        try:
            for index, (request, prompt_text) in enumerate(processed):
                self.output_processor.add_request(request, prompt_text, collector, parent, index)
                requests.append(request)
                child_ids.append(request.request_id)
        except BaseException:
            self.output_processor.abort_requests(child_ids)
            raise
        self._children[request_id] = child_ids
        finished = False
        try:
            for request in requests:
                await self.engine_core.add_request_async(request)
            while not finished:
                output = await collector.get()
                finished = output.finished
                yield output
        finally:
            self._children.pop(request_id, None)
            if not finished:  # cancelled, closed early, or failed: free its blocks
                await self._abort_quietly(child_ids)

    async def encode(self, prompt, pooling_params, request_id: str, priority: int = 0):
        """A pooling request (runner="pooling"): yields its one PoolingRequestOutput."""
        async for output in self.generate(prompt, pooling_params, request_id, priority):
            yield output

    async def abort(self, request_id: str | list[str]) -> None:
        """Abort requests by id; their generators end with finish_reason "abort"."""
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        ids = [c for r in ids for c in self._children.get(r, [r])]
        self.output_processor.abort_requests(ids)
        await self.engine_core.abort_requests_async(ids)

    async def _abort_quietly(self, request_ids: list[str]) -> None:
        self.output_processor.abort_requests(request_ids)
        if not self.errored:
            try:
                await asyncio.shield(self.engine_core.abort_requests_async(request_ids))
            except EngineDeadError:
                pass

    # ---- output handler -----------------------------------------------------------
    def _ensure_output_handler(self) -> None:
        if self._output_handler is None or self._output_handler.done():
            self._output_handler = asyncio.get_running_loop().create_task(self._run_output_handler())

    async def _run_output_handler(self) -> None:
        try:
            while True:
                outputs = await self.engine_core.get_output_async()
                iteration_stats = IterationStats() if self.stat_loggers else None
                # A step's outputs in chunks (vLLM's VLLM_V1_OUTPUT_PROC_CHUNK_SIZE): with many
                # streams the event loop still serves the clients in between.
                reqs_to_abort = []
                for start in range(0, len(outputs.outputs), OUTPUT_CHUNK_SIZE):
                    if start:
                        await asyncio.sleep(0)
                    reqs_to_abort += self.output_processor.process_outputs(
                        outputs.outputs[start:start + OUTPUT_CHUNK_SIZE], iteration_stats)[1]
                if reqs_to_abort:
                    await self.engine_core.abort_requests_async(reqs_to_abort)
                if outputs.scheduler_stats is not None:
                    self.last_scheduler_stats = outputs.scheduler_stats
                for stat_logger in self.stat_loggers:
                    stat_logger.record(outputs.scheduler_stats, iteration_stats, outputs.engine_index)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            logger.error("AsyncLLM output handler failed: %s", e)
            self._errored_with = e if isinstance(e, EngineDeadError) else EngineDeadError(str(e))
            self.output_processor.propagate_error(self._errored_with)

    def get_num_unfinished_requests(self) -> int:
        return self.output_processor.get_num_unfinished_requests()

    def fail_all_requests(self, error: Exception) -> None:
        """End every request in flight with `error` (its generator raises it and aborts it in
        the engine); the engine goes on serving new ones."""
        self.output_processor.propagate_error(error)

    # ---- state and utilities ------------------------------------------------------
    @property
    def errored(self) -> bool:
        return self._errored_with is not None or self.engine_core.engine_dead

    @property
    def is_running(self) -> bool:
        return not self.errored

    @property
    def engine_core_pid(self) -> int | None:
        return self.engine_core.engine_core_pid

    def get_tokenizer(self):
        return self.tokenizer

    def add_stat_logger(self, stat_logger) -> None:
        self.stat_loggers.append(stat_logger)

    @property
    def dead_engines(self) -> list[int]:
        """Data-parallel cores that died while the others serve on."""
        return list(getattr(self.engine_core, "dead_engines", ()))

    async def check_health(self) -> None:
        if self.errored:
            raise EngineDeadError()
        if self.dead_engines:
            raise EngineDeadError(f"Data-parallel engine core(s) {self.dead_engines} died; the "
                                  f"others keep serving. Restart the server to restore them.")

    async def get_stats(self) -> SchedulerStats:
        return SchedulerStats(**await self.engine_core.call_utility_async("get_stats"))

    async def get_stats_by_engine(self) -> dict[int, SchedulerStats]:
        """Each live engine core's stats, by its data-parallel index."""
        by_engine = await self.engine_core.call_utility_by_engine_async("get_stats")
        return {index: SchedulerStats(**stats) for index, stats in by_engine.items()}

    async def start_profile(self, profile_dir: str | None = None) -> str:
        """Trace the engine process (where the device work runs) with jax.profiler."""
        return await self.engine_core.call_utility_async("start_profile", profile_dir)

    async def stop_profile(self) -> None:
        await self.engine_core.call_utility_async("stop_profile")

    async def reset_prefix_cache(self) -> bool:
        return await self.engine_core.call_utility_async("reset_prefix_cache")

    @property
    def sleeping(self) -> bool:
        """Asleep, or on the way in or out of it: no request is admitted."""
        return not self.sleep_state.admits

    async def sleep(self, level: int = 1) -> None:
        check_sleep_level(level)
        async with self._sleep_lock:
            before = self.sleep_state.begin_sleep()
            try:
                await self.engine_core.call_utility_async("sleep", level)
            except BaseException:
                self.sleep_state.settle(asleep=before is SleepStage.ASLEEP)
                raise
            self.sleep_state.settle(asleep=True)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        async with self._sleep_lock:
            before = self.sleep_state.begin_wake_up()
            try:
                asleep = await self.engine_core.call_utility_async("wake_up", tags)
            except BaseException:  # refused (bad tags) or failed: the core changed nothing
                self.sleep_state.settle(asleep=before is SleepStage.ASLEEP)
                raise
            self.sleep_state.settle(asleep)

    async def is_sleeping(self) -> bool:
        return await self.engine_core.call_utility_async("is_sleeping")

    async def update_weights(self, path: str) -> None:
        """New weights from a safetensors directory or an Orbax checkpoint."""
        async with self._sleep_lock:
            self.sleep_state.settle(await self.engine_core.call_utility_async("update_weights", path))

    def shutdown(self) -> None:
        if self._output_handler is not None:
            self._output_handler.cancel()
        self.engine_core.shutdown()
