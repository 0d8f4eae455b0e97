"""The scheduler and LoRA adapters: at most max_loras distinct adapters per step (the base
model's requests are never held back by it), and prefix-cache pages never shared between
adapters."""
from __future__ import annotations

from sched_harness import FakeWorker, hashed_tokens, make_scheduler

from jaxvllm.core.request import Request
from jaxvllm.lora.request import LoRARequest
from jaxvllm.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=3, ignore_eos=True)


def lora(i: int) -> LoRARequest:
    return LoRARequest(f"adapter-{i}", i, f"/adapters/{i}")


def test_each_step_holds_at_most_max_loras_adapters_and_all_finish():
    sched = make_scheduler(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=32, num_blocks=40,
                           block_size=4, max_loras=2)
    worker = FakeWorker(4, hashed_tokens(3))
    adapters = [1, 2, 1, None, 3, 2, None, 3]
    for i, a in enumerate(adapters):
        sched.add_request(Request(f"r{i}", [1 + i] * 5, PARAMS, None, 0, lora_request=a and lora(a)))
    steps = []
    while sched.has_unfinished_requests():
        so = sched.schedule()
        steps.append({adapters[int(r[1:])] for r in so.num_scheduled_tokens} - {None})
        sched.update_from_output(so, worker.execute_model(so))
    assert all(len(s) <= 2 for s in steps)
    assert steps[0] == {1, 2}  # FCFS: the first two adapters, the base request beside them
    assert {3} <= set().union(*steps[1:])
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 39


def test_adapters_never_share_prefix_cache_pages():
    sched = make_scheduler(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=32, num_blocks=20,
                           block_size=4, enable_prefix_caching=True, max_loras=2)
    worker = FakeWorker(4, hashed_tokens(3))
    # The same prompt under: adapter 1, adapter 2, adapter 1 again, the base model.
    for i, a in enumerate([1, 2, 1, None]):
        sched.add_request(Request(f"r{i}", [1] * 9, SamplingParams(max_tokens=1), None, 0,
                                  lora_request=a and lora(a)))
        so = sched.schedule()
        sched.update_from_output(so, worker.execute_model(so))
        assert so.scheduled_new_reqs[0].num_computed_tokens == [0, 0, 8, 0][i]
        assert so.scheduled_new_reqs[0].lora_request == (a and lora(a))
