"""LLMEngine: the synchronous front end: Processor -> EngineCore -> OutputProcessor."""
from __future__ import annotations

import jax

from jaxvllm.config import EngineArgs, EngineConfig
from jaxvllm.engine.engine_core import EngineCore
from jaxvllm.engine.output_processor import OutputProcessor
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

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> "LLMEngine":
        model_path = resolve_model(args.model)
        hf_config = load_hf_config(model_path)
        config = args.create_engine_config(hf_config, jax.default_backend())
        return cls(config, model_path, hf_config, load_tokenizer(model_path))

    def add_request(self, request_id: str, prompt, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0) -> None:
        request, prompt_text = self.processor.process_inputs(request_id, prompt, params, arrival_time,
                                                             priority)
        self.output_processor.add_request(request, prompt_text)
        try:
            self.engine_core.add_request(request)
        except Exception:
            self.output_processor.abort_requests([request_id])
            raise

    def abort_request(self, request_ids) -> None:
        self.engine_core.abort_requests(request_ids)
        self.output_processor.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.get_num_unfinished_requests() > 0

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.step()
        request_outputs, reqs_to_abort = self.output_processor.process_outputs(outputs)
        if reqs_to_abort:
            self.engine_core.abort_requests(reqs_to_abort)
        return request_outputs
