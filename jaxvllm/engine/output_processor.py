"""OutputProcessor: turns EngineCoreOutputs into RequestOutputs.

Detokenizes incrementally, applies stop strings (which the engine core cannot see),
turns logprobs into vLLM's per-position dicts, records finish reasons and latency
statistics, and shapes each output by the request's output_kind (cumulative, delta or
final only). Children of an n > 1 request are gathered into their parent's output.
Requests that a stop string ends are reported back so that the caller aborts them in
the core and their blocks return to the pool. For AsyncLLM each request has a
RequestOutputCollector that its generator awaits. A pooling request's one output, its pooled
data, becomes a PoolingRequestOutput.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

import numpy as np

from jaxvllm.engine.detokenizer import IncrementalDetokenizer
from jaxvllm.engine.exceptions import EngineGenerateError, EngineSleepingError
from jaxvllm.engine.logprobs import LogprobsProcessor
from jaxvllm.engine.messages import EngineCoreRequest
from jaxvllm.engine.parallel_sampling import ParentRequest
from jaxvllm.metrics.stats import IterationStats, RequestStateStats
from jaxvllm.outputs import (
    CompletionOutput,
    EngineCoreOutput,
    FinishReason,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
)
from jaxvllm.sampling_params import RequestOutputKind

logger = logging.getLogger(__name__)


class RequestOutputCollector:
    """The latest undelivered output of one request. A slow consumer gets the outputs
    merged (delta outputs concatenated per completion index, cumulative ones replaced),
    never a backlog."""

    def __init__(self, output_kind: RequestOutputKind):
        self.delta = output_kind == RequestOutputKind.DELTA
        self.output: RequestOutput | Exception | None = None
        self.ready = asyncio.Event()

    def put(self, output: RequestOutput | Exception) -> None:
        if isinstance(self.output, Exception):
            return  # the error stands
        if self.delta and isinstance(self.output, RequestOutput) and isinstance(output, RequestOutput):
            output = _merge_deltas(self.output, output)
        self.output = output
        self.ready.set()

    async def get(self) -> RequestOutput:
        await self.ready.wait()
        output, self.output = self.output, None
        self.ready.clear()
        if isinstance(output, Exception):
            raise output
        return output


def _merge_deltas(prev: RequestOutput, new: RequestOutput) -> RequestOutput:
    by_index = {c.index: c for c in prev.outputs}
    for c in new.outputs:
        old = by_index.get(c.index)
        if old is not None:
            c.text, c.token_ids = old.text + c.text, old.token_ids + c.token_ids
            if old.logprobs is not None and c.logprobs is not None:
                c.logprobs = old.logprobs + c.logprobs
        by_index[c.index] = c
    new.outputs = sorted(by_index.values(), key=lambda c: c.index)
    new.prompt_logprobs = prev.prompt_logprobs or new.prompt_logprobs
    return new


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    detokenizer: IncrementalDetokenizer | None  # None for a pooling request
    logprobs: LogprobsProcessor | None
    output_kind: RequestOutputKind
    stats: RequestStateStats
    queue: RequestOutputCollector | None = None
    parent: ParentRequest | None = None  # set for the children of an n > 1 request
    parent_index: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    num_logprobs_sent: int = 0
    prompt_logprobs_sent: bool = False


class OutputProcessor:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}

    def add_request(self, request: EngineCoreRequest, prompt: str | None,
                    queue: RequestOutputCollector | None = None,
                    parent: ParentRequest | None = None, parent_index: int = 0) -> None:
        if request.request_id in self.request_states:
            raise ValueError(f"Request id {request.request_id!r} is already running.")
        params = request.sampling_params
        if params is None:  # pooling: no tokens to detokenize, one output at the end
            self.request_states[request.request_id] = RequestState(
                request_id=request.request_id, prompt=prompt, prompt_token_ids=request.prompt_token_ids,
                detokenizer=None, logprobs=None, output_kind=RequestOutputKind.FINAL_ONLY,
                stats=RequestStateStats(request.arrival_time), queue=queue)
            return
        self.request_states[request.request_id] = RequestState(
            request_id=request.request_id, prompt=prompt, prompt_token_ids=request.prompt_token_ids,
            detokenizer=IncrementalDetokenizer(self.tokenizer, request.prompt_token_ids, params),
            logprobs=LogprobsProcessor(self.tokenizer, params), output_kind=params.output_kind,
            stats=RequestStateStats(request.arrival_time, max_tokens_param=params.max_tokens),
            queue=queue, parent=parent, parent_index=parent_index)

    def abort_requests(self, request_ids) -> None:
        """Forget the requests; a streaming one gets a last output, finish_reason "abort",
        so that its generator ends."""
        for req_id in request_ids:
            state = self.request_states.pop(req_id, None)
            if state is not None and state.queue is not None and state.detokenizer is None:
                state.queue.put(EngineGenerateError("The request was aborted."))  # pooling: no partial output
            elif state is not None and state.queue is not None:
                output = self._make_output(state, [], FinishReason.ABORT, None)
                if output is not None:
                    state.queue.put(output)

    def propagate_error(self, error: Exception) -> None:
        """Fail every pending request (the engine died); their generators raise `error`."""
        for state in self.request_states.values():
            if state.queue is not None:
                state.queue.put(error)
        self.request_states.clear()

    def get_num_unfinished_requests(self) -> int:
        return len(self.request_states)

    def process_outputs(self, outputs: list[EngineCoreOutput], iteration_stats: IterationStats | None = None
                        ) -> tuple[list[RequestOutput], list[str]]:
        """Returns the RequestOutputs to hand out now (those with a queue go into it
        instead) and the ids to abort in the engine core. A request whose output cannot
        be processed (or that the engine failed) ends with an error; the others go on."""
        request_outputs, reqs_to_abort = [], []
        now = time.time()
        for out in outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted meanwhile
            if out.finish_reason == FinishReason.ERROR and state.queue is not None:
                self._fail(state, EngineSleepingError() if out.error == str(EngineSleepingError())
                           else EngineGenerateError(out.error or "The engine failed this request."))
                continue
            if state.detokenizer is None:
                self._process_pooled(state, out, request_outputs)
                continue
            try:
                output, abort = self._process_output(state, out, now, iteration_stats)
            except Exception as e:  # e.g. a detokenizer fault: this request's, not the engine's
                logger.exception("Processing the output of request %s failed.", out.request_id)
                self._fail(state, EngineGenerateError(f"Processing this request's output failed "
                                                      f"({type(e).__name__})."))
                reqs_to_abort.append(out.request_id)
                continue
            if abort:
                reqs_to_abort.append(out.request_id)
            if output is not None:
                if state.queue is not None:
                    state.queue.put(output)
                else:
                    request_outputs.append(output)
            if out.finished or abort:
                self.request_states.pop(out.request_id, None)
        return request_outputs, reqs_to_abort

    def _process_pooled(self, state: RequestState, out: EngineCoreOutput, request_outputs: list) -> None:
        if out.finish_reason == FinishReason.ABORT or out.pooling_output is None:
            self.request_states.pop(out.request_id, None)
            return
        output = PoolingRequestOutput(state.request_id, PoolingOutput(np.asarray(out.pooling_output, np.float32)),
                                      state.prompt_token_ids, finished=True, prompt=state.prompt)
        (state.queue.put if state.queue is not None else request_outputs.append)(output)
        self.request_states.pop(out.request_id, None)

    def _process_output(self, state: RequestState, out: EngineCoreOutput, now: float,
                        iteration_stats: IterationStats | None) -> tuple[RequestOutput | None, bool]:
        """One request's new tokens: detokenized, stop strings applied. Returns its output
        (None when its kind holds it back) and whether a stop string ended it."""
        finish_reason, stop_reason = out.finish_reason, out.stop_reason
        state.output_token_ids.extend(out.new_token_ids)
        if out.new_logprobs is not None or out.new_prompt_logprobs is not None:
            state.logprobs.update(out.new_logprobs, out.new_prompt_logprobs)
        stop_terminated = finish_reason == FinishReason.STOP
        stop_str = state.detokenizer.update(out.new_token_ids, stop_terminated)
        abort = stop_str is not None and finish_reason is None
        if abort:
            finish_reason, stop_reason = FinishReason.STOP, stop_str
        if iteration_stats is not None:
            self._record_stats(state, out, finish_reason, now, iteration_stats)
        output = self._make_output(state, out.new_token_ids, finish_reason, stop_reason)
        if output is not None and out.kv_transfer_params is not None:
            output.kv_transfer_params = out.kv_transfer_params
        return output, abort

    @staticmethod
    def _record_stats(state: RequestState, out: EngineCoreOutput, finish_reason, now: float,
                      it: IterationStats) -> None:
        n_prompt = len(state.prompt_token_ids)
        state.stats.update(len(out.new_token_ids), now, n_prompt, it, out.queued_time, out.prefill_time)
        if finish_reason is None:
            return
        state.stats.finish(str(finish_reason), now, n_prompt, it)
        parent, generated = state.parent, state.stats.num_generation_tokens
        if parent is None:
            it.max_num_generation_tokens_iter.append(generated)
            it.n_params_iter.append(1)
            return
        parent.max_num_generation_tokens = max(parent.max_num_generation_tokens, generated)
        parent.num_finished_stats += 1
        if parent.num_finished_stats == parent.params.n:
            it.max_num_generation_tokens_iter.append(parent.max_num_generation_tokens)
            it.n_params_iter.append(parent.params.n)

    def _fail(self, state: RequestState, error: Exception) -> None:
        """End one request with an error: its generator raises it (a sync caller, which has
        no queue, gets finish_reason "error" instead)."""
        self.request_states.pop(state.request_id, None)
        if state.queue is not None:
            state.queue.put(error)

    def _make_output(self, state: RequestState, new_token_ids: list[int],
                     finish_reason: FinishReason | None, stop_reason) -> RequestOutput | None:
        finished = finish_reason is not None
        kind = state.output_kind
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        delta = kind == RequestOutputKind.DELTA
        logprobs = state.logprobs.logprobs
        if logprobs is not None and delta:
            logprobs, state.num_logprobs_sent = logprobs[state.num_logprobs_sent:], len(logprobs)
        prompt_logprobs = state.logprobs.prompt_logprobs
        if delta and state.prompt_logprobs_sent:
            prompt_logprobs = None  # sent with the first delta only, as in vLLM
        state.prompt_logprobs_sent |= prompt_logprobs is not None
        completion = CompletionOutput(
            index=state.parent_index,
            text=state.detokenizer.get_next_output_text(delta=delta, finished=finished),
            token_ids=list(new_token_ids) if delta else list(state.output_token_ids),
            cumulative_logprob=state.logprobs.cumulative_logprob,
            logprobs=None if logprobs is None else list(logprobs),
            finish_reason=str(finish_reason) if finished else None,
            stop_reason=stop_reason,
        )
        if state.parent is not None:
            return state.parent.make_request_output(state.parent_index, completion, state.prompt,
                                                    state.prompt_token_ids, prompt_logprobs, kind)
        return RequestOutput(request_id=state.request_id, prompt=state.prompt,
                             prompt_token_ids=state.prompt_token_ids, outputs=[completion],
                             finished=finished, prompt_logprobs=prompt_logprobs)
