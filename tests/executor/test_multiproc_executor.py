"""The "mp" executor: two worker processes, one CPU device each, one 2-device mesh
(jax.distributed, gloo), driven by collective_rpc over ZMQ. It reproduces the in-process
engine's greedy tokens; killing a worker fails the in-flight request with a clear error,
without a hang, and shutdown leaves no process behind."""
from __future__ import annotations

import os
import shutil
import signal
import threading
import time

import pytest

from jaxvllm import LLM, SamplingParams
from jaxvllm.executor.multiproc import WorkerDiedError

ENGINE = dict(skip_warmup=True, max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
              num_gpu_blocks_override=64)
PROMPTS = [{"prompt_token_ids": p} for p in ([5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41])]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not a running orphan, but is not reaped either
        return f.read().split()[2] != "Z"


@pytest.fixture(scope="module")
def mp_llm(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), distributed_executor_backend="mp", tensor_parallel_size=2, **ENGINE)
    yield llm
    llm.llm_engine.shutdown()


def test_mp_executor_matches_in_process(mp_llm, tiny_model_dir):
    greedy = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)
    ours = [o.outputs[0].token_ids for o in mp_llm.generate(PROMPTS, greedy, use_tqdm=False)]
    ref = LLM(str(tiny_model_dir), **ENGINE)
    assert ours == [o.outputs[0].token_ids for o in ref.generate(PROMPTS, greedy, use_tqdm=False)]
    executor = mp_llm.llm_engine.engine_core.model_executor
    assert executor.world_size == 2 and len(executor.collective_rpc("get_num_compilations")) == 2


def test_sleep_and_update_weights_in_every_worker(mp_llm, tiny_model_dir, tmp_path):
    """Each worker frees its shards, and loads its own shards of an update; a refused update
    leaves the workers serving (a worker's ValueError is not a crash)."""
    from safetensors.numpy import load_file, save_file
    greedy = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)
    before = [o.outputs[0].token_ids for o in mp_llm.generate(PROMPTS, greedy, use_tqdm=False)]
    core = mp_llm.llm_engine.engine_core
    awake = core.device_memory_in_use()
    mp_llm.sleep(level=1)
    assert core.device_memory_in_use() < 0.1 * awake  # what stays: the penalty rows, a few small arrays
    tensors = load_file(str(tiny_model_dir / "model.safetensors"))
    new = {k: v * 1.05 for k, v in tensors.items()}
    compiled = core.model_executor.collective_rpc("get_num_compilations")
    mp_llm.update_weights(new)
    mp_llm.wake_up()
    assert core.model_executor.collective_rpc("get_num_compilations") == compiled
    ours = [o.outputs[0].token_ids for o in mp_llm.generate(PROMPTS, greedy, use_tqdm=False)]
    fresh_dir = tmp_path / "perturbed"
    shutil.copytree(tiny_model_dir, fresh_dir)
    save_file(new, str(fresh_dir / "model.safetensors"))
    theirs = LLM(str(fresh_dir), **ENGINE).generate(PROMPTS, greedy, use_tqdm=False)
    assert ours == [o.outputs[0].token_ids for o in theirs]
    assert ours != before
    with pytest.raises(ValueError, match="tensor 'model.norm.weight' has shape"):
        mp_llm.update_weights({"model.norm.weight": tensors["model.norm.weight"][:3]})
    mp_llm.update_weights(str(tiny_model_dir))
    assert [o.outputs[0].token_ids for o in mp_llm.generate(PROMPTS, greedy, use_tqdm=False)] == before


def test_killing_a_worker_fails_requests_cleanly(mp_llm):
    executor = mp_llm.llm_engine.engine_core.model_executor
    pids = [p.pid for p in executor.procs]
    killed_at = {}

    def kill():  # once the requests are in flight: 200 steps can end within a fixed delay
        while not mp_llm.llm_engine.has_unfinished_requests():
            time.sleep(0.001)
        killed_at["t"] = time.perf_counter()
        os.kill(pids[1], signal.SIGKILL)

    killer = threading.Thread(target=kill)
    killer.start()
    long = SamplingParams(temperature=0, max_tokens=200, min_tokens=200)
    with pytest.raises(WorkerDiedError, match=r"JaxvllmWorker-1 \(pid \d+\) died with exit code -9"):
        mp_llm.generate(PROMPTS, long, use_tqdm=False)
    print(f"in-flight requests failed {time.perf_counter() - killed_at['t']:.2f} s after the kill")
    killer.join()
    # The engine stays failed, immediately, and holds no request.
    with pytest.raises(WorkerDiedError):
        mp_llm.generate(PROMPTS[:1], long, use_tqdm=False)
    assert not mp_llm.llm_engine.has_unfinished_requests()
    start = time.perf_counter()
    mp_llm.llm_engine.shutdown()
    print(f"shutdown (grace, SIGTERM, SIGKILL of the survivor stuck in a collective): "
          f"{time.perf_counter() - start:.2f} s")
    assert not any(_alive(pid) for pid in pids)
