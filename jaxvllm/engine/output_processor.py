"""OutputProcessor: turns EngineCoreOutputs into RequestOutputs.

Detokenizes incrementally, applies stop strings (which the engine core cannot see) and
records finish reasons. Requests that a stop string ends are reported back so that the
caller aborts them in the core and their blocks return to the pool.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from jaxvllm.engine.detokenizer import IncrementalDetokenizer
from jaxvllm.engine.logprobs import LogprobsProcessor
from jaxvllm.engine.messages import EngineCoreOutput, EngineCoreRequest, FinishReason
from jaxvllm.engine.parallel_sampling import ParentRequest
from jaxvllm.outputs import CompletionOutput, RequestOutput


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer
    logprobs: LogprobsProcessor
    output_token_ids: list[int] = field(default_factory=list)
    parent: ParentRequest | None = None  # set for the children of an n > 1 request
    parent_index: int = 0


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request: EngineCoreRequest, prompt: str | None,
                    parent: ParentRequest | None = None, parent_index: int = 0) -> None:
        if request.request_id in self.request_states:
            raise ValueError(f"Request id {request.request_id!r} is already running.")
        self.request_states[request.request_id] = RequestState(
            request_id=request.request_id, prompt=prompt, prompt_token_ids=request.prompt_token_ids,
            detokenizer=IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids,
                                               request.sampling_params),
            logprobs=LogprobsProcessor(self.tokenizer, request.sampling_params),
            parent=parent, parent_index=parent_index)

    def abort_requests(self, request_ids) -> None:
        for req_id in request_ids:
            self.request_states.pop(req_id, None)

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the updated RequestOutputs and the ids to abort in the engine core."""
        request_outputs, reqs_to_abort = [], []
        for out in outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted meanwhile
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            state.output_token_ids.extend(out.new_token_ids)
            state.logprobs.update(out.new_logprobs, out.new_prompt_logprobs)
            stop_terminated = finish_reason == FinishReason.STOP
            stop_str = state.detokenizer.update(out.new_token_ids, stop_terminated)
            if stop_str is not None and finish_reason is None:
                finish_reason, stop_reason = FinishReason.STOP, stop_str
                reqs_to_abort.append(out.request_id)
            finished = finish_reason is not None
            completion = CompletionOutput(
                index=0,
                text=state.detokenizer.get_next_output_text(delta=False, finished=finished),
                token_ids=list(state.output_token_ids),
                cumulative_logprob=state.logprobs.cumulative_logprob,
                logprobs=None if state.logprobs.logprobs is None else list(state.logprobs.logprobs),
                finish_reason=str(finish_reason) if finished else None,
                stop_reason=stop_reason,
            )
            request_output = RequestOutput(
                request_id=state.request_id, prompt=state.prompt,
                prompt_token_ids=state.prompt_token_ids, outputs=[completion], finished=finished,
                prompt_logprobs=state.logprobs.prompt_logprobs)
            if state.parent is not None:
                request_output = state.parent.make_request_output(state.parent_index, completion,
                                                                  request_output)
            request_outputs.append(request_output)
            if finished:
                del self.request_states[out.request_id]
        return request_outputs, reqs_to_abort
