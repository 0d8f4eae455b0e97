"""LLMEngine: the synchronous front end: Processor -> EngineCore -> OutputProcessor."""
from __future__ import annotations

import jax

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.engine.engine_core import EngineCore
from jaxvllm.engine.output_processor import OutputProcessor
from jaxvllm.engine.parallel_sampling import ParentRequest
from jaxvllm.engine.processor import Processor
from jaxvllm.models.loader import load_hf_config, load_tokenizer, resolve_model
from jaxvllm.outputs import RequestOutput
from jaxvllm.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, model_path: str, hf_config, tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.engine_core = EngineCore(config, model_path, hf_config)
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            eos = getattr(hf_config, "eos_token_id", None)
            eos = eos[0] if isinstance(eos, list) else eos
        self.processor = Processor(config, tokenizer, hf_config.vocab_size, eos)
        self.output_processor = OutputProcessor(tokenizer)
        self._children: dict[str, list[str]] = {}  # n > 1 requests: parent id -> child ids

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        model_path = resolve_model(args.model)
        hf_config = load_hf_config(model_path)
        config = args.create_engine_config(hf_config, jax.default_backend())
        return cls(config, model_path, hf_config, load_tokenizer(model_path))

    def add_request(self, request_id: str, prompt, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0) -> None:
        """With params.n > 1 the request fans out into n children (parallel_sampling.py),
        whose outputs come back as one RequestOutput under `request_id`."""
        parent = ParentRequest.from_params(request_id, params)
        if parent is None:
            self._add_request(request_id, prompt, params, arrival_time, priority)
            return
        if request_id in self._children:
            raise ValueError(f"Request id {request_id!r} is already running.")
        added = []
        try:
            for index, (child_id, child_params) in enumerate(parent.child_requests()):
                self._add_request(child_id, prompt, child_params, arrival_time, priority, parent, index)
                added.append(child_id)
        except Exception:
            self.abort_request(added)
            raise
        self._children[request_id] = added

    def _add_request(self, request_id, prompt, params, arrival_time, priority, parent=None,
                     parent_index=0) -> None:
        request, prompt_text = self.processor.process_inputs(request_id, prompt, params, arrival_time,
                                                             priority)
        self.output_processor.add_request(request, prompt_text, parent, parent_index)
        try:
            self.engine_core.add_request(request)
        except Exception:
            self.output_processor.abort_requests([request_id])
            raise

    def abort_request(self, request_ids) -> None:
        request_ids = [c for r in request_ids for c in self._children.pop(r, [r])]
        self.engine_core.abort_requests(request_ids)
        self.output_processor.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.get_num_unfinished_requests() > 0

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.step()
        request_outputs, reqs_to_abort = self.output_processor.process_outputs(outputs)
        if reqs_to_abort:
            self.engine_core.abort_requests(reqs_to_abort)
        if self._children:
            for output in request_outputs:
                if output.finished:
                    self._children.pop(output.request_id, None)
        return request_outputs
