"""Run in a subprocess by the expert-parallel tests (8 simulated CPU devices must be set before
jax is imported; the rest of the suite runs on one).

python ep_check.py MODEL[,MODEL...] CONFIGS PROMPTS_JSON MAX_TOKENS -> JSON on the last stdout
line: per model and config (`2`: TP=2; `2ep`: TP=2 with enable_expert_parallel; `pp2x2`: two
pipeline stages of TP=2), the greedy
tokens, the per-device shard shapes of layer 0's experts, and under expert parallelism the
collectives in the compiled forward of the largest token bucket.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

import jax  # noqa: E402

from benchmarks.moe import collectives  # noqa: E402
from jaxvllm import LLM, SamplingParams  # noqa: E402


def shard_shapes(array) -> list[list[int]]:
    return [list(s.data.shape) for s in sorted(array.addressable_shards, key=lambda s: s.device.id)]


def main(models: str, configs: str, prompts: str, max_tokens: str) -> None:
    assert jax.device_count() == 8, jax.devices()
    prompts = json.loads(prompts)
    result = {model: run(model, configs.split(","), prompts, int(max_tokens)) for model in models.split(",")}
    print(json.dumps(result))


def run(model: str, configs: list[str], prompts: list[list[int]], n: int) -> dict:
    result = {}
    for config in configs:
        pp, tp = map(int, config[2:].split("x")) if config.startswith("pp") else (1, int(config.removesuffix("ep")))
        llm = LLM(model, tensor_parallel_size=tp,
                  pipeline_parallel_size=pp,
                  enable_expert_parallel=config.endswith("ep"), skip_warmup=True, max_num_seqs=4,
                  max_num_batched_tokens=16, max_model_len=128, num_gpu_blocks_override=32)
        runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
        if config.endswith("ep"):  # compiled once, ahead: the run uses it and its text is read
            forward, args, _ = runner.warmup_jobs()[len(runner.token_buckets) - 1]
            forward.warm(*args)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                               SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)
        layer = runner.params["layers"][0]
        result[config] = {
            "tokens": [o.outputs[0].token_ids for o in outputs],
            "experts": {name: shard_shapes(layer[name].get_value())
                        for name in ("experts_gate_up", "experts_down")},
        }
        if config.endswith("ep"):
            [compiled] = forward.programs.values()
            result[config]["collectives"] = collectives(compiled.as_text())
            del forward, args
        del llm, runner
    return result


if __name__ == "__main__":
    main(*sys.argv[1:])
