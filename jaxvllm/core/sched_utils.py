"""Per-request rules kept apart from the scheduler so each reads as one small function.

check_stop: whether a request is done after its latest sampled token, and why (length caps
first, then EOS and stop tokens once min_tokens is reached).
owes_prompt_logprobs: whether a request must still compute its whole prompt in one go
(prompt logprobs, or a pooling type that reads every position).
needs_host_tokens: whether a request's next step needs its last token on the host first.
num_new_tokens: how many tokens a request takes from a step's budget.
new_request_data: what the worker learns of a request scheduled for the first time.
"""
from __future__ import annotations

from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.core.sched_output import NewRequestData


def check_stop(request: Request, max_model_len: int) -> bool:
    params = request.sampling_params
    output = request.output_token_ids
    num_output = len(output)
    if (len(request.prompt_token_ids) + num_output >= max_model_len
            or (params.max_tokens is not None and num_output >= params.max_tokens)):
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if num_output < params.min_tokens:
        return False
    last = output[-1]
    if not params.ignore_eos and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False


def owes_prompt_logprobs(request: Request) -> bool:
    """The worker gathers prompt logprobs while it computes the prompt, so such a request
    must compute all of it in one worker lifetime: no cache hit, no swap mid-prompt. So must a
    pooling request whose pooler reads every position (MEAN, CLS, ALL)."""
    if request.pooling_params is not None:
        return bool(request.pooling_params.skip_reading_prefix_cache)
    return request.sampling_params.prompt_logprobs is not None and not request.output_token_ids


def needs_host_tokens(request: Request) -> bool:
    """Structured output (the grammar's next mask) and multi-token bad words (the output's
    tail) choose what the next step may sample from the token before it, on the host: with
    async scheduling, steps run synchronously while such a request is in the engine (as vLLM
    first did for structured output)."""
    params = request.sampling_params
    if params is None:  # a pooling request samples nothing
        return False
    return (params.structured_outputs is not None
            or any(len(w) > 1 for w in params.bad_words_token_ids))


def num_new_tokens(request: Request, token_budget: int, num_computed: int, max_model_len: int,
                   long_prefill_token_threshold: int) -> int:
    # Positions stop at max_model_len - 1: the token there is the last one computed.
    limit = max_model_len - 1 - num_computed
    num_new = min(request.num_tokens + request.num_output_placeholders - num_computed, token_budget, limit)
    if 0 < long_prefill_token_threshold < num_new:
        num_new = long_prefill_token_threshold
    return max(0, num_new)


def new_request_data(request: Request, block_ids: tuple[list[int], ...]) -> NewRequestData:
    return NewRequestData(
        req_id=request.request_id,
        prompt_token_ids=request.prompt_token_ids,
        output_token_ids=list(request.output_token_ids),
        sampling_params=request.sampling_params,
        sampling_seed=request.sampling_seed,
        eos_token_id=request.eos_token_id,
        block_ids=block_ids,
        num_computed_tokens=request.num_computed_tokens,
        pooling_params=request.pooling_params,
        lora_request=request.lora_request,
    )

