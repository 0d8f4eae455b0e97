"""The in-process executor: the EngineCore drives its Worker through the Executor interface
(executor/abstract.py, collective_rpc included), never the Worker or its ModelRunner directly."""
from __future__ import annotations

from jaxvllm import LLM, SamplingParams
from jaxvllm.executor.abstract import Executor
from jaxvllm.executor.uniproc import UniProcExecutor


def test_engine_core_drives_a_uniproc_executor(tiny_model_dir):
    llm = LLM(str(tiny_model_dir), skip_warmup=True, max_num_seqs=4, max_num_batched_tokens=64,
              max_model_len=128, num_gpu_blocks_override=32)
    executor = llm.llm_engine.engine_core.model_executor
    assert isinstance(executor, UniProcExecutor) and isinstance(executor, Executor)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, min_tokens=4),
                       use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    runner = executor.driver_worker.model_runner
    assert executor.collective_rpc("get_num_compilations") == [runner.num_compilations]
    assert executor.num_compilations == runner.num_compilations > 0
    (specs,) = executor.collective_rpc("get_kv_cache_spec")
    assert len(specs) == llm.llm_engine.hf_config.num_hidden_layers and executor.get_kv_cache_specs() == [specs]
    assert executor.kv_cache is runner.kv_cache and executor.kv_cache.shape[2] == 32
    llm.llm_engine.shutdown()
