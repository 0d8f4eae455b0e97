"""Runs in vLLM's own venv (.venv-peers): embedding throughput of vLLM (`runner="pooling"`,
`convert="embed"`) on the workloads written by benchmarks/embed.py. Starts the engine once,
embeds two prompts untimed, then times each workload `rounds` times and prints one
`RESULT {...}` line per workload and round.

    .venv-peers/bin/python benchmarks/peers/vllm_embed.py MODEL_DIR WORKLOADS_JSON
"""
from __future__ import annotations

import json
import sys
import time


def main(model_dir: str, path: str) -> None:
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    with open(path) as f:
        w = json.load(f)
    start = time.perf_counter()
    llm = LLM(model=model_dir, runner="pooling", convert="embed", dtype=w.get("dtype", "float32"), seed=0,
              max_num_seqs=w["max_num_seqs"], max_model_len=w["max_model_len"],
              max_num_batched_tokens=w["max_num_batched_tokens"], gpu_memory_utilization=0.5)
    startup_s = time.perf_counter() - start
    version = __import__("vllm").__version__
    workloads = {name: [TokensPrompt(prompt_token_ids=p) for p in prompts]
                 for name, prompts in w["workloads"].items()}
    llm.embed(next(iter(workloads.values()))[:2], use_tqdm=False)  # first-call warm-up
    for _ in range(w["rounds"]):
        for name, prompts in workloads.items():
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.embed(prompts, use_tqdm=False)
            elapsed = time.perf_counter() - start
            n_in = sum(len(p["prompt_token_ids"]) for p in prompts)
            print("RESULT " + json.dumps({"workload": name, "elapsed_s": elapsed, "input_tok_s": n_in / elapsed,
                                          "startup_s": startup_s, "version": version}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
