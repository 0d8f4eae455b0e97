"""Data parallelism: two engine cores, each in its own process on its own devices, behind
LLM and AsyncLLM. The cores simulate their own CPU devices (platforms/device_sets.py), so
TP=2 per replica runs from this single-device test process."""
from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import pytest

from jaxvllm import LLM, SamplingParams
from jaxvllm.config import EngineArgs
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.engine.async_llm import AsyncLLM
from jaxvllm.engine.dp_load_balancer import DPLoadBalancer
from jaxvllm.engine.exceptions import EngineGenerateError
from jaxvllm.engine.messages import EngineCoreOutputs
from jaxvllm.metrics.prometheus import PrometheusStatLogger
from jaxvllm.outputs import EngineCoreOutput, FinishReason
from jaxvllm.platforms.device_sets import restrict_visible_devices

ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
              num_gpu_blocks_override=128, skip_warmup=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21], [30, 31, 32], [40, 41, 42, 43, 44],
           [50, 51], [60, 61, 62], [70]]
GREEDY = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)


def test_balancer_spreads_a_batch_then_follows_reported_load():
    lb = DPLoadBalancer(2)
    assert [lb.choose(f"r{i}") for i in range(4)] == [0, 1, 0, 1]
    lb.record(0, EngineCoreOutputs(outputs=[EngineCoreOutput("r0", [1], FinishReason.STOP)],
                                   scheduler_stats=SchedulerStats(num_running_reqs=1)))
    lb.record(1, EngineCoreOutputs(scheduler_stats=SchedulerStats(num_running_reqs=2, num_waiting_reqs=3)))
    assert [lb.choose("r4"), lb.choose("r5")] == [0, 0] and "r0" not in lb.owner
    assert lb.take(["r1", "r2", "gone"]) == {1: ["r1"], 0: ["r2"]}
    assert lb.reported_load == [0, 4]  # an abort leaves the load at once
    failed = lb.fail_engine(1)
    assert [o.request_id for o in failed.outputs] == ["r3"]
    assert failed.outputs[0].finish_reason == FinishReason.ERROR and "core 1 died" in failed.outputs[0].error
    assert lb.choose("r6") == 0 and lb.num_routed == [5, 2]


def test_each_rank_sees_its_own_devices():
    """CPU: its own simulated devices; GPU: its slice of CUDA_VISIBLE_DEVICES; TPU: its own
    chips, as a one-process slice with its own port."""
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=x",
           "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    restrict_visible_devices(1, 2, env)
    assert env == {"XLA_FLAGS": "--xla_dump_to=x --xla_force_host_platform_device_count=2",
                   "CUDA_VISIBLE_DEVICES": "6,7", "TPU_VISIBLE_CHIPS": "2,3", "TPU_PROCESS_BOUNDS": "1,1,1",
                   "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,2,1", "TPU_PROCESS_PORT": "8477",
                   "TPU_PROCESS_ADDRESSES": "localhost:8477", "CLOUD_TPU_TASK_ID": "0"}
    env = {"TPU_VISIBLE_CHIPS": "0,1,2,3,4,5,6,7"}
    restrict_visible_devices(1, 4, env)
    assert (env["TPU_VISIBLE_CHIPS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == ("4,5,6,7", "1,4,1")
    env = {}
    restrict_visible_devices(0, 8, env)
    assert (env["TPU_VISIBLE_CHIPS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == ("0,1,2,3,4,5,6,7", "2,4,1")
    with pytest.raises(ValueError, match="needs 6 GPUs; CUDA_VISIBLE_DEVICES lists 4"):
        restrict_visible_devices(2, 2, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    with pytest.raises(ValueError, match="needs 8 TPU chips; TPU_VISIBLE_CHIPS lists 4"):
        restrict_visible_devices(1, 4, {"TPU_VISIBLE_CHIPS": "0,1,2,3"})


def test_metrics_label_each_engine_core():
    logger = PrometheusStatLogger("m", num_engines=2)
    logger.update_scheduler(SchedulerStats(num_running_reqs=3), 1)
    text = logger.render().decode()
    assert 'vllm:num_requests_running{engine="0",model_name="m"} 0.0' in text
    assert 'vllm:num_requests_running{engine="1",model_name="m"} 3.0' in text


@pytest.fixture(scope="module")
def single_device_tokens(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), **ENGINE)
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def test_llm_on_two_cores_of_two_devices_gives_single_device_tokens(tiny_model_dir,
                                                                     single_device_tokens):
    llm = LLM(str(tiny_model_dir), data_parallel_size=2, tensor_parallel_size=2, **ENGINE)
    client = llm.llm_engine.engine_core_client
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
        assert got == single_device_tokens
        assert client.balancer.num_routed == [4, 4]  # one batch, spread over both cores
        stats = llm.llm_engine.get_stats()
        assert stats.num_running_reqs == 0 and stats.num_free_blocks == stats.num_total_blocks == 2 * 127
    finally:
        llm.llm_engine.shutdown()
    assert not any(c.engine.proc.is_alive() for c in client.clients)


def test_async_llm_on_two_cores_and_one_dies(tiny_model_dir, single_device_tokens):
    """Greedy tokens of a single device from two one-device cores; then core 1 is killed:
    its requests fail within 5 s while core 0 finishes its own and takes new ones."""
    engine = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), data_parallel_size=2,
                                                  **ENGINE))
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def run(prompt, params, request_id):
        try:
            return [o async for o in engine.generate(prompt, params, request_id)]
        except EngineGenerateError as e:
            return e, time.monotonic()

    async def main():
        balancer = engine.engine_core.balancer
        greedy = await asyncio.gather(*(run(p, GREEDY, f"g{i}") for i, p in enumerate(PROMPTS)))
        assert [o[-1].outputs[0].token_ids for o in greedy] == single_device_tokens
        assert balancer.num_routed == [4, 4]

        # A stream left early is aborted on its own core, which frees its blocks.
        stream = engine.generate(PROMPTS[1], long, "early")
        await stream.__anext__()
        await stream.aclose()
        for _ in range(100):
            stats = await engine.get_stats_by_engine()
            if all(s.num_free_blocks == s.num_total_blocks for s in stats.values()):
                break
            await asyncio.sleep(0.05)
        assert [s.num_running_reqs + s.num_waiting_reqs for s in stats.values()] == [0, 0]
        assert all(s.num_free_blocks == s.num_total_blocks for s in stats.values())
        assert "early" not in balancer.owner

        assert sorted(await engine.get_stats_by_engine()) == [0, 1]
        tasks = [asyncio.create_task(run(p, long, f"r{i}")) for i, p in enumerate(PROMPTS[:4])]
        while sum(balancer.num_routed) != 13:
            await asyncio.sleep(0.01)
        # Killed at once: a utility call here would queue behind the cores' outputs, and the
        # tiny model's 200 tokens take well under a second.
        owners = dict(balancer.owner)
        os.kill(engine.engine_core.engine_core_pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        results = await asyncio.gather(*tasks)
        assert sorted(owners.values()) == [0, 0, 1, 1]
        for i, result in enumerate(results):
            if owners[f"r{i}"] == 1:
                error, failed_at = result
                assert "core 1 died" in str(error) and failed_at - killed_at < 5
            else:
                assert len(result[-1].outputs[0].token_ids) == 200
        assert not engine.errored and sorted(await engine.get_stats_by_engine()) == [0]
        routed = list(balancer.num_routed)
        after = await run(PROMPTS[4], GREEDY, "after")
        assert after[-1].outputs[0].token_ids == single_device_tokens[4]
        assert balancer.num_routed == [routed[0] + 1, routed[1]]  # the live core only

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_default_model_on_two_cores_gives_single_device_tokens():
    """DP=2 with TP=2 per core (each core simulating its own two devices; DP=2 at TP=1 runs on
    the tiny model above, test_async_llm_on_two_cores_and_one_dies)."""
    prompts = ["The capital of France is", "def fibonacci(n):", "The three primary colors are",
               "Once upon a time"]
    greedy = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)
    engine = dict(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                  num_gpu_blocks_override=64, skip_warmup=True)
    expected = [o.outputs[0].token_ids for o in LLM(**engine).generate(prompts, greedy, use_tqdm=False)]
    llm = LLM(data_parallel_size=2, tensor_parallel_size=2, **engine)
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
        assert got == expected
        assert llm.llm_engine.engine_core_client.balancer.num_routed == [2, 2]
    finally:
        llm.llm_engine.shutdown()


def test_stats_of_the_cores_add_up_count_by_count():
    """get_stats over cores: counts summed, per-position counts by position, a KV connector's
    named counters by name (a core may report names the other has not yet)."""
    from jaxvllm.core.stats import SchedulerStats
    from jaxvllm.engine.dp_client import combine_utility_results
    total = combine_utility_results("get_stats", [
        SchedulerStats(num_preemptions=1, spec_decode_num_accepted_tokens_per_pos=[1, 2], kv_cache_usage=0.5,
                       kv_connector_stats={"external_prefix_cache_hits": 16}),
        dataclasses.asdict(SchedulerStats(num_preemptions=2, spec_decode_num_accepted_tokens_per_pos=[3, 4],
                                          kv_connector_stats={"external_prefix_cache_hits": 32,
                                                              "TPU_to_CPU_total_bytes": 7}))])
    assert total["num_preemptions"] == 3 and total["spec_decode_num_accepted_tokens_per_pos"] == [4, 6]
    assert total["kv_connector_stats"] == {"external_prefix_cache_hits": 48, "TPU_to_CPU_total_bytes": 7}
    assert total["kv_cache_usage"] == 0.25
