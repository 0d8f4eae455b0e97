"""Scheduler: vLLM V1's token-budget loop.

Each step hands out at most `max_num_batched_tokens` tokens: first to running requests
(decodes and unfinished prefills, in admission order), then to waiting requests in queue
order (FCFS, or priority then arrival) while fewer than `max_num_seqs` run. A long prompt
is cut into chunks that fit the budget (chunked prefill), and no more than
`long_prefill_token_threshold` tokens per step when set, so prefill chunks and decodes
share one step. A waiting request's cached prefix (prefix caching) is not computed again:
it starts at the hit length.

A pooling request (runner="pooling") is prefilled the same way, chunks included; the step
that computes its last prompt token returns its pooled output instead of a token, and it
finishes there, its pages freed at once.

When the pool has no page left for a running request, a request not yet scheduled this
step is preempted (core/preemption.py: recomputed later, or swapped to host slots).

With `max_concurrent_batches` > 1 (pipeline parallelism) the in-flight batch rules apply
(core/in_flight.py). The scheduler takes its config sections (SchedulerConfig, CacheConfig)
and the KV cache pool the engine sized (KVCacheConfig, core/kv_cache_interface.py).
"""
from __future__ import annotations

import time

from jaxvllm.config.engine_config import CacheConfig, SchedulerConfig
from jaxvllm.core.in_flight import InFlightBatches
from jaxvllm.core.kv_cache_interface import KVCacheConfig
from jaxvllm.core.kv_cache_manager import KVCacheManager
from jaxvllm.core.preemption import pick_victim, preempt
from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.request_queue import create_request_queue
from jaxvllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput
from jaxvllm.core.sched_utils import (
    check_stop,
    needs_host_tokens,
    new_request_data,
    num_new_tokens,
    owes_prompt_logprobs,
)
from jaxvllm.core.spec_decode import SpecDecodingStats, accept_tokens
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.core.structured_output import StructuredOutputManager
from jaxvllm.core.swap_space import SwapSpace
from jaxvllm.kv_transfer.base import KVConnectorRole
from jaxvllm.kv_transfer.factory import KVConnectorFactory
from jaxvllm.outputs import EngineCoreOutput, FinishReason, ModelRunnerOutput


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 kv_cache_config: KVCacheConfig, *, model_name: str = "",
                 structured_output_manager: StructuredOutputManager | None = None,
                 max_concurrent_batches: int = 1, num_spec_tokens: int = 0, num_lookahead_tokens: int = 0,
                 use_eagle: bool = False, max_loras: int = 0, engine_config=None):
        """num_spec_tokens: speculative decoding's most drafts per request (0: off); the
        drafts themselves come back with each step's tokens (ModelRunnerOutput).
        num_lookahead_tokens: slots allocated past each step's tokens (a draft model writes
        its drafts' KV there, vLLM's name); use_eagle: an EAGLE-3 head drafts. max_loras:
        most distinct LoRA adapters in one step (the worker's device slots); 0: none served.
        engine_config: the whole EngineConfig, where its kv_transfer section asks for a KV
        connector (kv_transfer), whose scheduler side lives here."""
        s = scheduler_config
        if s.preemption_mode not in ("recompute", "swap"):
            raise ValueError(f"preemption_mode must be 'recompute' or 'swap', got {s.preemption_mode!r}.")
        self.max_num_seqs = s.max_num_seqs
        self.max_num_batched_tokens = s.max_num_batched_tokens
        self.max_model_len = s.max_model_len
        self.long_prefill_token_threshold = s.long_prefill_token_threshold
        self.max_loras = max_loras
        self.num_lookahead_tokens = num_lookahead_tokens
        self.policy = s.scheduling_policy
        self.kv_cache_manager = KVCacheManager(
            kv_cache_config.num_blocks, kv_cache_config.block_size, s.max_model_len,
            cache_config.enable_prefix_caching, model_name,
            [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups], use_eagle)
        self.swap_space = (SwapSpace(kv_cache_config.num_swap_blocks) if s.preemption_mode == "swap"
                           else None)
        self.structured_output_manager = structured_output_manager
        self.connector = (KVConnectorFactory.create_connector(
            engine_config, KVConnectorRole.SCHEDULER, kv_cache_config,
            kv_cache_manager=self.kv_cache_manager, use_eagle=use_eagle)
            if engine_config is not None and engine_config.kv_transfer is not None else None)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(s.scheduling_policy)
        self.running: list[Request] = []
        # Admitted, with pages, while a KV connector loads their prompt's KV (P/D's decode side).
        self.waiting_for_remote: dict[str, Request] = {}
        # Requests the worker holds state for; the rest get full data when scheduled.
        self._worker_known: set[str] = set()
        self._finished_req_ids: set[str] = set()
        self.host_token_req_ids: set[str] = set()  # requests that need_host_tokens
        self.in_flight = (InFlightBatches(s.max_num_seqs, max_concurrent_batches)
                          if max_concurrent_batches > 1 else None)
        self.num_preemptions = 0
        self.num_swap_outs = 0
        self.num_prefill_tokens = 0
        self.spec_decoding_stats = SpecDecodingStats(num_accepted_tokens_per_pos=[0] * num_spec_tokens)

    # ---- requests in and out -------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.sampling_params is not None and request.sampling_params.structured_outputs is not None:
            if self.structured_output_manager is None:
                raise ValueError("structured_outputs needs an engine with a tokenizer.")
            self.structured_output_manager.add_request(request)
        self.requests[request.request_id] = request
        self.waiting.add_request(request)
        if needs_host_tokens(request):
            self.host_token_req_ids.add(request.request_id)

    def finish_requests(self, request_ids, status: RequestStatus) -> None:
        """Finish requests from outside (abort, stop string): pages are freed at once."""
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        for req_id in request_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            elif request.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                del self.waiting_for_remote[req_id]
            else:
                self.waiting.remove_request(request)
            request.status = status
            self._free_request(request)

    def abort_requests(self, request_ids) -> None:
        self.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def _free_request(self, request: Request) -> dict | None:
        """Returns the KV connector's kv_transfer_params for the request's last output."""
        params = None
        if self.connector is not None:
            _, params = self.connector.request_finished(
                request, self.kv_cache_manager.get_block_ids(request.request_id))
        self.kv_cache_manager.free(request)
        if self.swap_space is not None:
            self.swap_space.free(request.request_id)
        del self.requests[request.request_id]
        self.host_token_req_ids.discard(request.request_id)
        if self.structured_output_manager is not None:
            self.structured_output_manager.remove_request(request.request_id)
        if request.request_id in self._worker_known:
            self._worker_known.discard(request.request_id)
            self._finished_req_ids.add(request.request_id)
        return params

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.waiting_for_remote)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0

    def reset_prefix_cache(self) -> bool:
        """Forget the cached prefixes, the connector's (host tier) too."""
        if not self.kv_cache_manager.reset_prefix_cache():
            return False
        if self.connector is not None:
            self.connector.reset_cache()
        return True

    # ---- one step ------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        token_budget = self.max_num_batched_tokens
        num_scheduled: dict[str, int] = {}
        new_reqs: list[NewRequestData] = []
        cached = CachedRequestData()
        preempted: set[str] = set()
        swap_out: list[tuple[int, int]] = []
        swap_in: list[tuple[int, int]] = []
        spec_tokens: dict[str, list[int]] = {}

        in_flight, max_reqs = ((self.in_flight.req_ids, self.in_flight.max_batch_reqs) if self.in_flight is not None
                               else ((), self.max_num_seqs))
        loras: set[int] = set()  # the adapters of this step's requests
        index = 0
        while index < len(self.running) and token_budget > 0 and len(num_scheduled) < max_reqs:
            request = self.running[index]
            if request.request_id in in_flight:
                index += 1
                continue
            if not self._lora_fits(request, loras):
                index += 1  # it waits for a step whose adapters leave it a slot
                continue
            num_computed = request.num_computed_tokens
            num_new = request.num_tokens + request.num_output_placeholders - num_computed
            drafts = None
            if num_new == 1:  # a decode: the common case, kept cheap
                num_new = int(num_computed < self.max_model_len - 1)
                drafts = request.spec_token_ids
                if drafts and num_new:  # speculative decoding: its drafts are verified with it
                    num_new = min(1 + len(drafts), token_budget, self.max_model_len - 1 - num_computed)
            else:
                num_new = num_new_tokens(request, token_budget, num_computed, self.max_model_len,
                                         self.long_prefill_token_threshold)
            if num_new == 0:
                index += 1
                continue
            while (blocks := self.kv_cache_manager.allocate_slots(
                    request, num_new, num_lookahead_tokens=self.num_lookahead_tokens)) is None:
                victim = pick_victim(self.running, index, self.policy)
                self.running.remove(victim)
                swap_out.extend(self._preempt(victim))
                preempted.add(victim.request_id)
                if victim is request:
                    break
            if blocks is None:
                continue  # it preempted itself; the next request now sits at `index`
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            index += 1
            if drafts:
                if num_new > 1:
                    spec_tokens[request.request_id] = drafts[:num_new - 1]
                request.spec_token_ids = []
            if request.request_id in self._worker_known:
                cached.req_ids.append(request.request_id)
                cached.new_block_ids.append(blocks.get_block_ids())
                cached.num_computed_tokens.append(num_computed)
            else:
                new_reqs.append(new_request_data(request, self.kv_cache_manager.get_block_ids(request.request_id)))
            self._advance(request, num_new)  # scheduled requests are never a victim later on

        # A step that had to preempt admits nobody new: pages are short. (This also keeps
        # swap-ins and swap-outs out of the same step, so no host slot is both.)
        while (not preempted and self.waiting and token_budget > 0 and len(num_scheduled) < max_reqs
               and len(self.running) + len(self.waiting_for_remote) < self.max_num_seqs):
            request = self.waiting.peek_request()
            if request.request_id in in_flight or not self._lora_fits(request, loras):
                break  # preempted while in flight: it resumes once its token is back
            hit, num_hit = self.kv_cache_manager.empty_kv_cache_blocks, 0
            # The connector's tokens past the device's hit are loaded, not computed: allocated
            # like new tokens, outside the token budget. A host-tier hit loads before the
            # step's forward; a remote prefill's KV (P/D) arrives later, while the request waits.
            num_external, load_async = 0, False
            # (prompt logprobs need every position computed)
            if request.status != RequestStatus.SWAPPED and not owes_prompt_logprobs(request):
                hit, num_hit = self.kv_cache_manager.get_computed_blocks(request)
                if self.connector is not None:
                    num_external, load_async = self.connector.get_num_new_matched_tokens(request, num_hit)
                    if num_external is None:
                        break  # the connector cannot take it yet (P/D: the held copies are at their cap)
            if load_async and num_external:
                if not self._admit_remote(request, hit, num_hit, num_external):
                    break
                continue
            num_new = num_new_tokens(request, token_budget, request.num_computed_tokens + num_hit + num_external,
                                     self.max_model_len, self.long_prefill_token_threshold)
            if num_new == 0:
                break
            blocks = self.kv_cache_manager.allocate_slots(
                request, num_new + num_external, None if request.status == RequestStatus.SWAPPED else hit,
                num_hit, self.num_lookahead_tokens)
            if blocks is None:
                break
            self.waiting.pop_request()
            if request.status == RequestStatus.SWAPPED:
                swap_in.extend(self.swap_space.swap_in(request.request_id,
                                                       self.kv_cache_manager.get_block_ids(request.request_id)))
            elif self.connector is not None:
                self.connector.update_state_after_alloc(
                    request, self.kv_cache_manager.get_blocks(request.request_id), num_external)
            request.num_computed_tokens += num_hit + num_external
            request.status = RequestStatus.RUNNING
            request.scheduled_time = request.scheduled_time or time.time()
            self.running.append(request)
            num_scheduled[request.request_id] = num_new
            token_budget -= num_new
            new_reqs.append(new_request_data(request, self.kv_cache_manager.get_block_ids(request.request_id)))
            self._advance(request, num_new)

        for data in new_reqs:
            self._worker_known.add(data.req_id)
        output = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled,
            total_num_scheduled_tokens=self.max_num_batched_tokens - token_budget,
            finished_req_ids=self._finished_req_ids,
            preempted_req_ids=preempted,
            blocks_to_swap_out=swap_out,
            blocks_to_swap_in=swap_in,
            scheduled_spec_decode_tokens=spec_tokens,
        )
        self._finished_req_ids = set()
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output)
        if self.in_flight is not None:
            self.in_flight.dispatched(num_scheduled)
        requests = self.requests
        manager = self.structured_output_manager
        if manager is not None and manager.matchers:
            # Constrained requests that sample this step (not mid-prompt) get their mask.
            output.grammar_bitmask = manager.grammar_bitmask(
                [r for r in num_scheduled if r in manager.matchers
                 and requests[r].num_computed_tokens >= requests[r].num_tokens], spec_tokens)
        return output

    def _admit_remote(self, request: Request, hit, num_hit: int, num_external: int) -> bool:
        """Pages for the prompt now (kept out of the prefix cache until filled); the request
        waits outside the batch until the connector reports its load (update_from_output)."""
        if self.kv_cache_manager.allocate_slots(request, num_external, hit, num_hit, delay_cache_blocks=True) is None:
            return False
        self.waiting.pop_request()
        self.connector.update_state_after_alloc(request, self.kv_cache_manager.get_blocks(request.request_id),
                                                num_external)
        request.num_computed_tokens += num_hit
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        request.scheduled_time = request.scheduled_time or time.time()
        self.waiting_for_remote[request.request_id] = request
        return True

    def _finish_remote_loads(self, finished_recving: set[str], invalid_block_ids: set[int]) -> None:
        """Loaded requests run, computing only their last prompt token (for its logits); one
        whose load failed computes its prompt past the local hit instead, in the same pages."""
        for req_id in finished_recving:
            request = self.waiting_for_remote.pop(req_id, None)
            if request is None:
                continue  # aborted while its KV was on the way
            ids = self.kv_cache_manager.get_block_ids(req_id)
            if not any(b in invalid_block_ids for group in ids for b in group):
                request.num_computed_tokens = request.num_tokens - 1
            request.status = RequestStatus.RUNNING
            self.running.append(request)

    def _lora_fits(self, request: Request, loras: set[int]) -> bool:
        """Whether the request's adapter fits this step (at most max_loras distinct ones);
        if so it is counted in."""
        if request.lora_request is None:
            return True
        lora_id = request.lora_request.lora_int_id
        if lora_id not in loras and len(loras) >= self.max_loras:
            return False
        loras.add(lora_id)
        return True

    def _advance(self, request: Request, num_new: int) -> None:
        """The step computes num_new more of the request's tokens; when they reach its end it
        samples, and the token is in flight (a placeholder) until update_from_output."""
        start = request.num_computed_tokens
        num_prompt = len(request.prompt_token_ids)
        if start < num_prompt:
            self.num_prefill_tokens += min(num_new, num_prompt - start)
        request.num_computed_tokens = start + num_new
        if request.pooling_params is not None:
            return  # it pools when its prompt is computed: no token in flight
        if start + num_new >= num_prompt + len(request.output_token_ids) + request.num_output_placeholders:
            request.num_output_placeholders += 1

    def _preempt(self, request: Request) -> list[tuple[int, int]]:
        """Preempt the request (core/preemption.py) back to the waiting queue; returns its
        swap-out pairs."""
        pairs = preempt(request, self.kv_cache_manager, self.swap_space)
        request.spec_token_ids = []
        if pairs is not None:
            self.num_swap_outs += 1
        self.num_preemptions += 1
        self._worker_known.discard(request.request_id)
        self.waiting.prepend_request(request)
        return pairs or []

    # ---- results back --------------------------------------------------------------
    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        outputs = []
        if self.in_flight is not None:
            self.in_flight.returned(scheduler_output.num_scheduled_tokens)
        if self.connector is not None and (kv_output := runner_output.kv_connector_output) is not None:
            self.connector.update_connector_output(kv_output)
            if kv_output.finished_recving:
                self._finish_remote_loads(kv_output.finished_recving, kv_output.invalid_block_ids)
        if runner_output.pooler_output:
            return self._update_pooled(runner_output)
        logprobs, prompt_logprobs = runner_output.logprobs, runner_output.prompt_logprobs
        grammar, requests, max_model_len = scheduler_output.grammar_bitmask, self.requests, self.max_model_len
        next_drafts = runner_output.spec_token_ids  # None unless speculative decoding
        for i, (req_id, sampled) in enumerate(zip(runner_output.req_ids,
                                                  runner_output.sampled_token_ids)):
            if not sampled:
                continue  # a prefill chunk that samples nothing
            request = requests.get(req_id)
            if request is None:
                continue  # finished meanwhile: a token sampled a step late is dropped
            running = request.status == RequestStatus.RUNNING
            if next_drafts is None:
                request.output_token_ids.extend(sampled)
            else:  # several tokens, each checked for a stop (core/spec_decode.py)
                sampled = accept_tokens(request, sampled, len(scheduler_output.scheduled_spec_decode_tokens.get(
                    req_id, ())), next_drafts[i], max_model_len, self.spec_decoding_stats)
            first = len(request.output_token_ids) == len(sampled)
            if request.num_output_placeholders:  # 0 after a preemption while it was in flight
                request.num_output_placeholders -= 1
            if grammar and req_id in grammar:
                manager = self.structured_output_manager
                for token in sampled:  # several with speculative decoding
                    if (error := manager.accept_token(req_id, token)) is not None:
                        request.error, request.status = error, RequestStatus.FINISHED_ERROR
                        break
                if request.error is None and request.spec_token_ids:
                    request.spec_token_ids = manager.validate_drafts(req_id, request.spec_token_ids)
            if request.error is None and not check_stop(request, max_model_len):
                if logprobs is None and not prompt_logprobs and not first:  # the cheap path
                    outputs.append(EngineCoreOutput(req_id, sampled, None, request.stop_reason))
                    continue
                finish_reason = kv_transfer_params = None
            else:
                if running:
                    self.running.remove(request)
                else:  # preempted while its token was in flight
                    self.waiting.remove_request(request)
                kv_transfer_params = self._free_request(request)
                finish_reason = request.get_finished_reason()
            outputs.append(EngineCoreOutput(
                request_id=req_id,
                new_token_ids=sampled,
                finish_reason=finish_reason,
                stop_reason=request.stop_reason,
                new_logprobs=logprobs[i] and logprobs[i].first(len(sampled)) if logprobs is not None else None,
                new_prompt_logprobs=prompt_logprobs.get(req_id) if prompt_logprobs else None,
                error=request.error,
                queued_time=request.scheduled_time - request.arrival_time if first else None,
                prefill_time=time.time() - request.scheduled_time if first else None,
                kv_transfer_params=kv_transfer_params,
            ))
        return outputs

    def _update_pooled(self, runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Pooling requests whose prompt the step finished: done, their pages freed now."""
        outputs = []
        for req_id, pooled in zip(runner_output.req_ids, runner_output.pooler_output):
            request = self.requests.get(req_id)
            if pooled is None or request is None:
                continue  # a partial prefill chunk, or aborted meanwhile
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:  # preempted after the step that pooled it
                self.waiting.remove_request(request)
            request.status = RequestStatus.FINISHED_STOPPED
            self._free_request(request)
            outputs.append(EngineCoreOutput(
                request_id=req_id, new_token_ids=[], finish_reason=FinishReason.STOP,
                pooling_output=pooled, queued_time=request.scheduled_time - request.arrival_time,
                prefill_time=time.time() - request.scheduled_time))
        return outputs

    # ---- statistics ----------------------------------------------------------------
    @property
    def kv_cache_usage(self) -> float:
        return self.kv_cache_manager.usage

    def make_stats(self) -> SchedulerStats:
        num_swapped = len(self.swap_space.req_to_slots) if self.swap_space is not None else 0
        prefix, spec = self.kv_cache_manager.prefix_cache_stats, self.spec_decoding_stats
        return SchedulerStats(
            num_running_reqs=len(self.running),
            num_waiting_reqs=len(self.waiting) + len(self.waiting_for_remote) - num_swapped,
            num_swapped_reqs=num_swapped, kv_cache_usage=self.kv_cache_usage,
            prefix_cache_queries=prefix.queries, prefix_cache_hits=prefix.hits,
            num_preemptions=self.num_preemptions, num_swap_outs=self.num_swap_outs,
            num_prefill_tokens=self.num_prefill_tokens,
            num_free_blocks=self.kv_cache_manager.block_pool.get_num_free_blocks(),
            num_total_blocks=self.kv_cache_manager.block_pool.num_blocks - 1,
            spec_decode_num_drafts=spec.num_drafts, spec_decode_num_draft_tokens=spec.num_draft_tokens,
            spec_decode_num_accepted_tokens=spec.num_accepted_tokens,
            spec_decode_num_accepted_tokens_per_pos=list(spec.num_accepted_tokens_per_pos),
            kv_connector_stats=self.connector.make_stats() if self.connector is not None else {})
