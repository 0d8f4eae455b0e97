"""Pooling requests in the scheduler (no model): prefilled in chunks like any prompt, never
given a decode step, finished by the step that returns their pooled output, their pages
freed there; those whose pooler reads every position never read the prefix cache."""
from __future__ import annotations

from sched_harness import make_scheduler

from jaxvllm.core.request import Request, RequestStatus
from jaxvllm.outputs import FinishReason, ModelRunnerOutput
from jaxvllm.pooling_params import PoolingParams


def pooling_request(req_id: str, prompt: list[int], pooling_type: str = "LAST") -> Request:
    params = PoolingParams(task="embed", pooling_type=pooling_type,
                           skip_reading_prefix_cache=pooling_type != "LAST")
    return Request(req_id, prompt, None, None, 0, pooling_params=params)


def step(scheduler, pooled: dict[str, list]):
    """One schedule, and the worker's answer: `pooled` for the requests whose prompt the step
    finishes."""
    out = scheduler.schedule()
    ids = list(out.num_scheduled_tokens)
    done = {r: scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_prompt_tokens for r in ids}
    runner = ModelRunnerOutput(ids, [[] for _ in ids], pooler_output=[pooled[r] if done[r] else None for r in ids])
    return out, scheduler.update_from_output(out, runner)


def test_chunks_then_pooled_output_and_pages_freed():
    s = make_scheduler(max_num_seqs=4, max_num_batched_tokens=8, max_model_len=64, num_blocks=16, block_size=4)
    pool = s.kv_cache_manager.block_pool
    free = pool.get_num_free_blocks()
    s.add_request(pooling_request("a", list(range(1, 20))))  # 19 tokens: chunks of 8, 8, 3
    chunks = []
    while s.has_unfinished_requests():
        out, outputs = step(s, {"a": [0.5, 0.25]})
        chunks.append(out.num_scheduled_tokens.get("a", 0))
    assert chunks == [8, 8, 3]  # no decode step after the prompt
    (final,) = outputs
    assert (final.finish_reason, final.pooling_output, final.new_token_ids) == (FinishReason.STOP, [0.5, 0.25], [])
    assert pool.get_num_free_blocks() == free and not s.requests


def test_mean_pooling_skips_the_prefix_cache_and_last_reads_it():
    s = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, num_blocks=32, block_size=4,
                       enable_prefix_caching=True)
    prompt = list(range(1, 30))
    for req_id, kind in (("first", "LAST"), ("mean", "MEAN"), ("last", "LAST")):
        s.add_request(pooling_request(req_id, prompt, kind))
        out, _ = step(s, {req_id: [1.0]})
        assert out.scheduled_new_reqs[0].num_computed_tokens == (28 if req_id == "last" else 0), req_id
        assert s.requests.get(req_id) is None or s.requests[req_id].status != RequestStatus.RUNNING
