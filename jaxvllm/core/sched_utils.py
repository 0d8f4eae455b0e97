"""check_stop: whether a request is done after its latest sampled token, and why.

Kept apart from the scheduler so the finish rules (length caps first, then EOS and stop
tokens once min_tokens is reached) read as one small function.
"""
from __future__ import annotations

from jaxvllm.core.request import Request, RequestStatus


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
