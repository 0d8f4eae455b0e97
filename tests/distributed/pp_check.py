"""Run in a subprocess by the pipeline-parallel tests (the device count is fixed when jax
is imported; the rest of the suite runs on one device).

python pp_check.py MODEL|default PPxTP[w][,...] PROMPTS_JSON MAX_TOKENS -> JSON on the last
stdout line: per layout, the greedy tokens (plain, and with penalties and logprobs), and per stage
its KV cache's per-device shard shapes and which of embedding / final norm / head it holds.
A layout ending in "w" is warmed up and checked for recompilation.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

import jax  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402


def main(model: str, layouts: str, prompts: str, max_tokens: str) -> None:
    prompts = [{"prompt_token_ids": p} for p in json.loads(prompts)]
    n = int(max_tokens)
    greedy = SamplingParams(temperature=0, max_tokens=n, min_tokens=n)
    extended = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, repetition_penalty=1.3, logprobs=2)
    result = {}
    for layout in layouts.split(","):
        warmup = layout.endswith("w")
        pp, tp = map(int, layout.removesuffix("w").split("x"))
        llm = LLM(None if model == "default" else model, pipeline_parallel_size=pp,
                  tensor_parallel_size=tp, skip_warmup=not warmup, check_recompilation=warmup,
                  max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128, num_gpu_blocks_override=64)
        worker = llm.llm_engine.engine_core.model_executor.driver_worker
        result[layout] = {
            "tokens": [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)],
            "extended": [[o.outputs[0].token_ids, o.outputs[0].cumulative_logprob]
                         for o in llm.generate(prompts, extended, use_tqdm=False)]}
        caches = worker.model_runner.kv_cache  # the step's (the one before was donated)
        result[layout].update({
            "kv_shards": [[list(s.data.shape) for s in c.addressable_shards]
                          for c in (caches if isinstance(caches, tuple) else [caches])],
            "holds": [[name for name in ("embed_tokens", "norm", "lm_head") if getattr(m, name) is not None]
                      for m in getattr(worker, "stages", [worker.model])]})
        del llm, worker, caches
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
