"""One of two local "hosts" for the multi-host test: 4 simulated CPU devices per process,
one 8-device mesh over both (jax.distributed with gloo collectives), tensor parallel over 8.

python multihost_check.py RANK PORT MODEL PROMPTS_JSON MAX_TOKENS
Rank 0 schedules and prints its greedy tokens as JSON on the last stdout line; rank 1 follows.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

import jax  # noqa: E402

from jaxvllm.config import EngineArgs  # noqa: E402


def main(rank: str, port: str, model: str, prompts: str, max_tokens: str) -> None:
    engine = dict(model=model, tensor_parallel_size=8, nnodes=2, node_rank=int(rank),
                  master_addr="127.0.0.1", master_port=int(port), skip_warmup=True, max_num_seqs=8,
                  max_num_batched_tokens=128, max_model_len=256, num_gpu_blocks_override=64)
    if int(rank) > 0:
        from jaxvllm.executor.multihost import run_follower
        run_follower(EngineArgs(**engine))
        return
    from jaxvllm import LLM, SamplingParams
    llm = LLM(**engine)
    n = int(max_tokens)
    outputs = llm.generate([{"prompt_token_ids": p} for p in json.loads(prompts)],
                           SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)
    kv = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner.kv_cache
    result = {"tokens": [o.outputs[0].token_ids for o in outputs], "process_count": jax.process_count(),
              "global_devices": jax.device_count(), "local_devices": jax.local_device_count(),
              "kv_cache_devices": len(kv.sharding.device_set)}
    llm.llm_engine.shutdown()
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
