"""LLMEngine: the synchronous front end: Processor -> EngineCore client -> OutputProcessor.

The core runs in this process by default (so tests and notebooks can look inside it);
with multiprocess_mode=True (or JAXVLLM_ENABLE_MULTIPROCESSING=1) it runs in its own
process behind ZMQ, as it does for AsyncLLM; with data_parallel_size > 1, N cores run in
N processes (dp_client.py).
"""
from __future__ import annotations

import dataclasses
import os
import tempfile

import jax

from jaxvllm.config import EngineArgs
from jaxvllm.config.verify import verify_target_model
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.engine.core_client import InprocClient, SyncMPClient
from jaxvllm.engine.dp_client import DPSyncMPClient
from jaxvllm.engine.engine_core import EngineCore
from jaxvllm.engine.output_processor import OutputProcessor
from jaxvllm.engine.parallel_sampling import ParentRequest
from jaxvllm.engine.processor import Processor, eos_token_id
from jaxvllm.engine.sleep_state import SleepState, check_sleep_level
from jaxvllm.executor.multihost import initialize_distributed
from jaxvllm.outputs import RequestOutput
from jaxvllm.sampling_params import SamplingParams
from jaxvllm.transformers_utils.config import load_hf_config
from jaxvllm.transformers_utils.model_path import resolve_model
from jaxvllm.transformers_utils.tokenizer import load_tokenizer
from jaxvllm.transformers_utils.weights_dir import write_weights_dir


class LLMEngine:
    def __init__(self, args: EngineArgs, multiprocess_mode: bool = False):
        model_path = resolve_model(args.model, args.revision, args.download_dir)
        args = dataclasses.replace(args, model=model_path)  # the engine process loads the same
        self.hf_config = hf_config = load_hf_config(model_path)
        verify_target_model(hf_config, model_path)
        self.tokenizer = tokenizer = load_tokenizer(model_path)
        if args.data_parallel_size > 1:
            self.engine_core_client = DPSyncMPClient(args)
            config = self.engine_core_client.config
        elif multiprocess_mode:
            self.engine_core_client = SyncMPClient(args)
            config = self.engine_core_client.config
        else:
            initialize_distributed(args)  # multi-host: before the backend starts
            config = args.create_engine_config(hf_config, jax.default_backend(), model_path)
            self.engine_core_client = InprocClient(config)
        self.config = config
        self.processor = Processor(config, tokenizer, hf_config.vocab_size,
                                   eos_token_id(tokenizer, hf_config))
        self.output_processor = OutputProcessor(tokenizer)
        self._children: dict[str, list[str]] = {}  # n > 1 requests: parent id -> child ids
        self.sleep_state = SleepState()  # as the last sleep / wake_up / update_weights left it

    @classmethod
    def from_engine_args(cls, args: EngineArgs, multiprocess_mode: bool | None = None) -> "LLMEngine":
        if multiprocess_mode is None:
            multiprocess_mode = os.environ.get("JAXVLLM_ENABLE_MULTIPROCESSING", "0") == "1"
        return cls(args, multiprocess_mode)

    @property
    def engine_core(self) -> EngineCore:
        """The in-process EngineCore (only without multiprocessing)."""
        if not isinstance(self.engine_core_client, InprocClient):
            raise AttributeError("The engine core runs in another process; use engine_core_client.")
        return self.engine_core_client.engine_core

    def add_request(self, request_id: str, prompt, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0, lora_request=None) -> None:
        """With params.n > 1 the request fans out into n children (parallel_sampling.py),
        whose outputs come back as one RequestOutput under `request_id`."""
        parent = ParentRequest.from_params(request_id, params)
        if parent is None:
            self._add_request(request_id, prompt, params, arrival_time, priority, lora_request=lora_request)
            return
        if request_id in self._children:
            raise ValueError(f"Request id {request_id!r} is already running.")
        added = []
        try:
            for index, (child_id, child_params) in enumerate(parent.child_requests()):
                self._add_request(child_id, prompt, child_params, arrival_time, priority, parent, index,
                                  lora_request)
                added.append(child_id)
        except Exception:
            self.abort_request(added)
            raise
        self._children[request_id] = added

    def _add_request(self, request_id, prompt, params, arrival_time, priority, parent=None,
                     parent_index=0, lora_request=None) -> None:
        self.sleep_state.check_admits()
        request, prompt_text = self.processor.process_inputs(request_id, prompt, params, arrival_time,
                                                             priority, lora_request)
        self.output_processor.add_request(request, prompt_text, parent=parent, parent_index=parent_index)
        try:
            self.engine_core_client.add_request(request)
        except Exception:
            self.output_processor.abort_requests([request_id])
            raise

    def abort_request(self, request_ids) -> None:
        request_ids = [c for r in request_ids for c in self._children.pop(r, [r])]
        self.engine_core_client.abort_requests(request_ids)
        self.output_processor.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.get_num_unfinished_requests() > 0

    def get_stats(self) -> SchedulerStats:
        stats = self.engine_core_client.call_utility("get_stats")
        return SchedulerStats(**stats) if isinstance(stats, dict) else stats

    def reset_prefix_cache(self) -> bool:
        return self.engine_core_client.call_utility("reset_prefix_cache")

    def start_profile(self, profile_dir: str | None = None) -> str:
        return self.engine_core_client.call_utility("start_profile", profile_dir)

    def stop_profile(self) -> None:
        self.engine_core_client.call_utility("stop_profile")

    @property
    def sleeping(self) -> bool:
        return not self.sleep_state.admits

    def sleep(self, level: int = 1) -> None:
        self.engine_core_client.call_utility("sleep", check_sleep_level(level))
        self.sleep_state.settle(asleep=True)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleep_state.settle(self.engine_core_client.call_utility("wake_up", tags))

    def is_sleeping(self) -> bool:
        return self.engine_core_client.call_utility("is_sleeping")

    def update_weights(self, weights) -> None:
        """A dict of arrays reaches an engine in another process as a temporary safetensors
        file (messages carry no arrays); in this process it is passed as it is."""
        if isinstance(weights, (str, os.PathLike)) or isinstance(self.engine_core_client, InprocClient):
            self.sleep_state.settle(self.engine_core_client.call_utility(
                "update_weights", os.fspath(weights) if isinstance(weights, os.PathLike) else weights))
            return
        with tempfile.TemporaryDirectory(prefix="jaxvllm-weights-") as path:
            write_weights_dir(weights, path)
            self.sleep_state.settle(self.engine_core_client.call_utility("update_weights", path))

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core_client.get_output()
        with jax.profiler.TraceAnnotation("output_processing"):
            request_outputs, reqs_to_abort = self.output_processor.process_outputs(outputs.outputs)
        if reqs_to_abort:
            self.engine_core_client.abort_requests(reqs_to_abort)
        if self._children:
            for output in request_outputs:
                if output.finished:
                    self._children.pop(output.request_id, None)
        return request_outputs

    def shutdown(self) -> None:
        self.engine_core_client.shutdown()
