"""Scheduler: vLLM V1's token-budget loop.

Each step hands out at most `max_num_batched_tokens` tokens: first to running requests
(decodes and unfinished prefills, oldest first), then to waiting requests in arrival
order while fewer than `max_num_seqs` run. A long prompt is cut into chunks that fit the
budget (chunked prefill), so prefill chunks and decodes share one step. When the pool
has no page left for a running request, the newest running request is preempted: its
pages are freed and it goes back to the front of the queue to be recomputed.
"""
from __future__ import annotations

from collections import deque

from jaxvllm.core.kv_cache_manager import KVCacheManager
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.sched_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                       SchedulerOutput)
from jaxvllm.engine.messages import EngineCoreOutput, FinishReason

_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH_CAPPED: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_IGNORED: FinishReason.LENGTH,
}


class Scheduler:
    def __init__(self, *, max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int,
                 num_blocks: int, block_size: int):
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.kv_cache_manager = KVCacheManager(num_blocks, block_size, max_model_len)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Requests the worker holds state for; the rest get full data when scheduled.
        self._worker_known: set[str] = set()
        self._finished_req_ids: set[str] = set()
        self.num_preemptions = 0

    # ---- requests in and out -------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, request_ids, status: RequestStatus) -> None:
        """Finish requests from outside (abort, stop string): pages are freed at once."""
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        del self.requests[request.request_id]
        if request.request_id in self._worker_known:
            self._worker_known.discard(request.request_id)
            self._finished_req_ids.add(request.request_id)

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    # ---- one step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        token_budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        preempted: set[str] = set()

        index = 0
        while index < len(self.running) and token_budget > 0:
            request = self.running[index]
            num_new = self._num_new_tokens(request, token_budget)
            if num_new == 0:
                index += 1
                continue
            while (blocks := self.kv_cache_manager.allocate_slots(request, num_new)) is None:
                victim = self.running.pop()
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is request:
                    break
            if blocks is None:
                break
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            index += 1
            if request.request_id in self._worker_known:
                cached.req_ids.append(request.request_id)
                cached.new_block_ids.append(blocks.get_block_ids())
                cached.num_computed_tokens.append(request.num_computed_tokens)
            else:
                new_reqs.append(self._new_request_data(request))

        # A step that had to preempt admits nobody new: pages are short.
        while (not preempted and self.waiting and token_budget > 0
               and len(self.running) < self.max_num_seqs):
            request = self.waiting[0]
            num_new = self._num_new_tokens(request, token_budget)
            if num_new == 0 or self.kv_cache_manager.allocate_slots(request, num_new) is None:
                break
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            new_reqs.append(self._new_request_data(request))

        for data in new_reqs:
            self._worker_known.add(data.req_id)
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self._finished_req_ids,
            preempted_req_ids=preempted,
        )
        self._finished_req_ids = set()
        for req_id, n in num_scheduled.items():
            self.requests[req_id].num_computed_tokens += n
        return output

    def _num_new_tokens(self, request: Request, token_budget: int) -> int:
        # Positions stop at max_model_len - 1: the token there is the last one computed.
        limit = self.max_model_len - 1 - request.num_computed_tokens
        return max(0, min(request.num_tokens - request.num_computed_tokens, token_budget, limit))

    def _new_request_data(self, request: Request) -> NewRequestData:
        return NewRequestData(
            req_id=request.request_id,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=list(request.output_token_ids),
            sampling_params=request.sampling_params,
            sampling_seed=request.sampling_seed,
            eos_token_id=request.eos_token_id,
            block_ids=self.kv_cache_manager.get_block_ids(request.request_id),
            num_computed_tokens=request.num_computed_tokens,
        )

    def _preempt(self, request: Request) -> None:
        """Recompute preemption: drop the pages, keep the tokens, requeue at the front."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self._worker_known.discard(request.request_id)
        self.waiting.appendleft(request)

    # ---- results back --------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        outputs = []
        for req_id, sampled in zip(runner_output.req_ids, runner_output.sampled_token_ids):
            request = self.requests.get(req_id)
            if request is None or not sampled:
                continue  # finished meanwhile, or a prefill chunk that samples nothing
            request.output_token_ids.extend(sampled)
            finished = self._check_stop(request)
            if finished:
                self.running.remove(request)
                self._free_request(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id,
                new_token_ids=sampled,
                finish_reason=_FINISH_REASON[request.status] if finished else None,
                stop_reason=request.stop_reason,
            ))
        return outputs

    def _check_stop(self, request: Request) -> bool:
        params = request.sampling_params
        if (request.num_tokens >= self.max_model_len
                or (params.max_tokens is not None and request.num_output_tokens >= params.max_tokens)):
            request.status = RequestStatus.FINISHED_LENGTH_CAPPED
            return True
        if request.num_output_tokens < params.min_tokens:
            return False
        last = request.output_token_ids[-1]
        if not params.ignore_eos and last == request.eos_token_id:
            request.status = RequestStatus.FINISHED_STOPPED
            return True
        if last in params.stop_token_ids:
            request.status = RequestStatus.FINISHED_STOPPED
            request.stop_reason = last
            return True
        return False

    # ---- statistics ----------------------------------------------------------------
    @property
    def kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage
