"""The EngineCore in its own process: msgpack messages, the sync client under LLM, and
AsyncLLM streaming, aborting and failing cleanly when the engine process dies."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from jaxvllm import LLM, SamplingParams
from jaxvllm.config import EngineArgs
from jaxvllm.core.stats import SchedulerStats
from jaxvllm.engine.async_llm import AsyncLLM
from jaxvllm.engine.exceptions import EngineDeadError
from jaxvllm.engine.messages import EngineCoreOutputs, EngineCoreRequest, UtilityOutput
from jaxvllm.outputs import EngineCoreOutput, FinishReason
from jaxvllm.sampling_params import RequestOutputKind
from jaxvllm.serial_utils import decode, encode

ENGINE = dict(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
              num_gpu_blocks_override=128, skip_warmup=True)
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [20, 21]]


def test_messages_round_trip_through_msgpack():
    req = EngineCoreRequest("r1", [1, 2, 3], SamplingParams(temperature=0.5, stop=["x"], seed=7,
                                                            output_kind=RequestOutputKind.DELTA),
                            eos_token_id=2, sampling_seed=7, arrival_time=1.5, priority=3)
    assert decode(EngineCoreRequest, encode(req)) == req
    outs = EngineCoreOutputs(
        outputs=[EngineCoreOutput("a", [4], FinishReason.LENGTH), EngineCoreOutput("b", [])],
        scheduler_stats=SchedulerStats(num_running_reqs=2, kv_cache_usage=0.25),
        timestamp=3.0, utility_output=UtilityOutput(4, result=True))
    back = decode(EngineCoreOutputs, encode(outs))
    assert back == outs and back.outputs[0].finish_reason is FinishReason.LENGTH


def test_decoding_rejects_a_wrong_shape():
    with pytest.raises(TypeError, match="Expected a map for EngineCoreRequest"):
        decode(EngineCoreRequest, encode([1, 2, 3]))


def test_llm_with_engine_process_matches_in_process(tiny_model_dir, monkeypatch):
    params = SamplingParams(temperature=0, max_tokens=12, min_tokens=12)
    inproc = LLM(str(tiny_model_dir), **ENGINE)
    expected = [o.outputs[0].token_ids for o in inproc.generate(PROMPTS, params, use_tqdm=False)]
    monkeypatch.setenv("JAXVLLM_ENABLE_MULTIPROCESSING", "1")
    llm = LLM(str(tiny_model_dir), **ENGINE)
    client = llm.llm_engine.engine_core_client
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        assert got == expected
        stats = llm.llm_engine.get_stats()
        assert stats.num_running_reqs == 0 and stats.num_free_blocks == stats.num_total_blocks == 127
        assert llm.reset_prefix_cache() is True
    finally:
        llm.llm_engine.shutdown()
    assert not client.engine.proc.is_alive()


@pytest.fixture
def async_engine(tiny_model_dir):
    engine = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir), **ENGINE))
    yield engine
    engine.shutdown()


async def _collect(engine, prompt, params, request_id):
    return [out async for out in engine.generate(prompt, params, request_id)]


def test_async_streaming_kinds_and_early_exit_abort(async_engine):
    async def main():
        greedy = dict(temperature=0, max_tokens=10, min_tokens=10)
        cumulative, delta, final = await asyncio.gather(
            _collect(async_engine, PROMPTS[0], SamplingParams(**greedy), "c"),
            _collect(async_engine, PROMPTS[0], SamplingParams(
                **greedy, output_kind=RequestOutputKind.DELTA), "d"),
            _collect(async_engine, PROMPTS[0], SamplingParams(
                **greedy, output_kind=RequestOutputKind.FINAL_ONLY), "f"))
        full = cumulative[-1].outputs[0]
        assert len(full.token_ids) == 10 and full.finish_reason == "length"
        assert [t for o in delta for t in o.outputs[0].token_ids] == full.token_ids
        assert "".join(o.outputs[0].text for o in delta) == full.text
        assert len(final) == 1 and final[0].outputs[0].token_ids == full.token_ids

        # Leave a long request after two outputs: the engine must abort it and free its blocks.
        stream = async_engine.generate(PROMPTS[1], SamplingParams(temperature=0, max_tokens=200,
                                                                  ignore_eos=True), "early")
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 2:
                break
        await stream.aclose()
        for _ in range(100):
            stats = await async_engine.get_stats()
            if stats.num_running_reqs == 0 and stats.num_waiting_reqs == 0:
                break
            await asyncio.sleep(0.05)
        assert stats.num_running_reqs == stats.num_waiting_reqs == 0
        assert stats.num_free_blocks == stats.num_total_blocks

        with pytest.raises(ValueError, match="temperature"):
            await _collect(async_engine, PROMPTS[0], SamplingParams(temperature=-1), "bad")
    asyncio.run(main())


def test_async_engine_death_fails_requests_fast(async_engine):
    async def main():
        stream = async_engine.generate(PROMPTS[2], SamplingParams(max_tokens=200, ignore_eos=True), "x")
        await stream.__anext__()
        os.kill(async_engine.engine_core_pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        assert time.monotonic() - start < 5
        with pytest.raises(EngineDeadError):
            await async_engine.check_health()
        with pytest.raises(EngineDeadError):
            await _collect(async_engine, PROMPTS[0], SamplingParams(max_tokens=2), "after")
    asyncio.run(main())


def test_engine_rejection_is_reported_not_dropped(async_engine):
    """A request the core refuses (here a duplicate id sent around the front end's own
    check) comes back finished with ERROR and a message instead of leaving its caller waiting."""
    async def main():
        request, _ = async_engine.processor.process_inputs(
            "dup", PROMPTS[0], SamplingParams(max_tokens=50, ignore_eos=True))
        client = async_engine.engine_core
        await client.add_request_async(request)
        await client.add_request_async(request)
        rejected = []
        while not rejected:  # the first copy's tokens may come before the rejection
            outputs = await asyncio.wait_for(client.get_output_async(), 30)
            rejected = [o for o in outputs.outputs if o.finish_reason == FinishReason.ERROR]
        assert [o.request_id for o in rejected] == ["dup"] and rejected[0].new_token_ids == []
        assert "already running" in rejected[0].error
        await client.abort_requests_async(["dup"])
    asyncio.run(main())


def test_requests_the_engine_cannot_hold_fail_alone(async_engine):
    """Values that once overflowed the sampler's int32 rows and killed the busy loop, sent
    around the front end's validation to one engine: each of those requests ends with an
    error of its own, and a normal request after them is served by the same engine process."""
    bad_values = {"top_k": 2**31, "temperature": float("inf"), "seed": 2**64 - 1, "n": True}

    async def main():
        client = async_engine.engine_core
        pid = client.engine_core_pid
        for field, value in bad_values.items():
            request, _ = async_engine.processor.process_inputs(
                f"bad-{field}", PROMPTS[0], SamplingParams(max_tokens=4))
            setattr(request.sampling_params, field, value)
            await client.add_request_async(request)
        errors = {}
        while len(errors) < len(bad_values):
            outputs = await asyncio.wait_for(client.get_output_async(), 30)
            errors.update({o.request_id: o for o in outputs.outputs})
        for field in bad_values:
            bad = errors[f"bad-{field}"]
            assert bad.finish_reason == FinishReason.ERROR and field in bad.error, bad
        outs = [o async for o in async_engine.generate(PROMPTS[1], SamplingParams(max_tokens=3), "ok")]
        assert len(outs[-1].outputs[0].token_ids) == 3 and client.engine_core_pid == pid
        assert not async_engine.errored
    asyncio.run(main())
