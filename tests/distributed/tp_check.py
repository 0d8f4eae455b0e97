"""Run in a subprocess by the tensor-parallel tests: 8 simulated CPU devices must be set
before jax is imported, and the rest of the suite runs on one.

python tp_check.py MODEL|default TP[,TP...] PROMPTS_JSON MAX_TOKENS [ATTENTION_BACKEND] -> JSON on
the last stdout line: per TP, the greedy tokens (and, but for the default model, whose tests
compare greedy tokens only, those of the extended sampler) and the per-device shard shapes of
every weight and the KV cache. A TP of "ppN" runs N pipeline stages of one device instead (greedy tokens and each
stage's KV cache shape only); "specN" runs TP=N with speculative decoding (suffix; greedy tokens
with ignore_eos, which the other runs of a random model report too, and the draft tokens),
"draftN" the same with the model as its own draft model (method draft_model, on the same mesh).
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

import jax  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402
from jaxvllm.distributed.partition import param_name  # noqa: E402
from jaxvllm.transformers_utils.model_path import default_model_path  # noqa: E402


def shard_shapes(array) -> list[list[int]]:
    return [list(s.data.shape) for s in sorted(array.addressable_shards, key=lambda s: s.device.id)]


def main(model: str, tps: str, prompts: str, max_tokens: str, attention_backend: str = "auto") -> None:
    assert jax.device_count() == 8, jax.devices()
    prompts = json.loads(prompts)
    n = int(max_tokens)
    greedy = SamplingParams(temperature=0, max_tokens=n, min_tokens=n)
    result = {}
    ignore_eos = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)  # min_tokens gets no drafts
    for tp in tps.split(","):
        pp = int(tp.removeprefix("pp")) if tp.startswith("pp") else 1
        spec = ({"method": "suffix", "num_speculative_tokens": 3} if tp.startswith("spec") else
                {"method": "draft_model", "model": default_model_path() if model == "default" else model,
                 "num_speculative_tokens": 3} if tp.startswith("draft") else None)
        size = 1 if pp > 1 else int(tp.removeprefix("spec").removeprefix("draft"))
        llm = LLM(None if model == "default" else model, tensor_parallel_size=size,
                  pipeline_parallel_size=pp, skip_warmup=True,
                  max_num_seqs=8, max_num_batched_tokens=128, max_model_len=256,
                  num_gpu_blocks_override=64, attention_backend=attention_backend, speculative_config=spec)
        if spec:
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], ignore_eos, use_tqdm=False)
            stats = llm.llm_engine.get_stats()
            result[tp] = {"ignore_eos": [o.outputs[0].token_ids for o in outputs],
                          "draft_tokens": stats.spec_decode_num_draft_tokens,
                          "accepted_tokens": stats.spec_decode_num_accepted_tokens}
            del llm
            continue
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
        runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
        result[tp] = {"tokens": [o.outputs[0].token_ids for o in outputs]}
        if pp > 1:  # the stages' split is the point; the sampler after them is the TP=1 one
            result[tp]["kv_cache"] = [list(c.shape) for c in runner.kv_cache]
            del llm, runner
            continue
        if model != "default":
            # The extended sampler (penalties, logprobs) reads the replicated hidden states too.
            extended = llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(
                temperature=0, max_tokens=n, min_tokens=n, repetition_penalty=1.3, logprobs=2),
                use_tqdm=False)
            result[tp]["extended"] = [[o.outputs[0].token_ids, o.outputs[0].cumulative_logprob]
                                      for o in extended]
            result[tp]["ignore_eos"] = [o.outputs[0].token_ids for o in llm.generate(
                [{"prompt_token_ids": p} for p in prompts], ignore_eos, use_tqdm=False)]
        leaves = jax.tree_util.tree_flatten_with_path(runner.params)[0]
        spec = llm.llm_engine.engine_core.model_executor.driver_worker.model.weights()
        result[tp].update({
            "weights": {param_name(path): {"shape": list(x.shape), "shards": shard_shapes(x),
                                           "partition": list(spec[param_name(path)].partition)}
                        for path, x in leaves},
            "kv_cache": {"shape": list(runner.kv_cache.shape),
                         "shards": shard_shapes(runner.kv_cache)},
        })
        del llm, runner
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
