"""Run in a subprocess by test_pipeline_parallel.py (the device count is fixed when jax is
imported): models served at PP=1 and PP=2, each with its `quantization` (or none).

python pp_logprobs_check.py MODEL[=QUANTIZATION] ... -> JSON on the last stdout line: per model
and layout, the prompt logprobs of one prompt and, for a mixture of experts, the dtype each
stage stores its experts in.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

import qwix  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402


def run(model: str, quantization: str | None) -> dict:
    prompt = {"prompt_token_ids": [5, 17, 33, 60, 91, 120, 7, 44]}
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    result = {}
    for pp in (1, 2):
        llm = LLM(model, pipeline_parallel_size=pp, quantization=quantization, skip_warmup=True,
                  max_num_seqs=2, max_model_len=64, num_gpu_blocks_override=16)
        worker = llm.llm_engine.engine_core.model_executor.driver_worker
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        stages = getattr(worker, "stages", [worker.model])
        experts = [m.layers[0]["experts_gate_up"].get_value() for m in stages if "experts_gate_up" in m.layers[0]]
        result[pp] = {
            "prompt_logprobs": [next(iter(lp.values())).logprob for lp in out.prompt_logprobs[1:]],
            "expert_dtypes": [str((w.qvalue if isinstance(w, qwix.QArray) else w).dtype) for w in experts]}
        del llm, worker
    return result


if __name__ == "__main__":
    result = {}
    for arg in sys.argv[1:]:
        model, _, quantization = arg.partition("=")
        result[arg] = run(model, quantization or None)
    print(json.dumps(result))
