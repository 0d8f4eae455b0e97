"""Runs in vLLM's own venv (.venv-peers, `make bench-peers`): offline throughput of
vLLM on a workload file written by benchmarks/throughput.py. Starts the engine once, warms
it with a first call of two requests (as jaxvllm's is), prints `READY {...}`, then runs the
whole workload once for each line `run` on stdin, printing `RESULT {...}` after each, until
stdin closes (benchmarks/peers/runners.py: VllmRun).

    .venv-peers/bin/python benchmarks/peers/vllm_throughput.py MODEL_DIR WORKLOAD_JSON
"""
from __future__ import annotations

import json
import sys
import time


def main(model_dir: str, workload_path: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with open(workload_path) as f:
        w = json.load(f)
    start = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=w["max_num_seqs"],
              max_model_len=w["max_model_len"],
              max_num_batched_tokens=w["max_num_batched_tokens"], seed=0,
              gpu_memory_utilization=0.5)  # Gemma 3 270M's start-up refused the default here
    startup_s = time.perf_counter() - start
    prompts = [TokensPrompt(prompt_token_ids=p) for p in w["prompts"]]
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in w["output_lens"]]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # first-call warm-up, not timed
    version = __import__("vllm").__version__
    print("READY " + json.dumps({"startup_s": startup_s, "version": version}), flush=True)
    n_in = sum(len(p) for p in w["prompts"])
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        llm.reset_prefix_cache()  # every run computes every prompt (jaxvllm's does the same)
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        print("RESULT " + json.dumps({"elapsed_s": elapsed, "output_tokens": n_out, "input_tokens": n_in,
                                      "output_tok_s": n_out / elapsed, "input_tok_s": n_in / elapsed,
                                      "requests_s": len(outs) / elapsed, "startup_s": startup_s,
                                      "version": version}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
