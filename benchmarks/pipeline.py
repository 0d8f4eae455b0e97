"""Pipeline parallelism with and without the batch queue (engine/batch_queue.py): the same
greedy workload on PP=2 stages of simulated CPU devices (or the accelerator's devices), with
P batches in flight of max_num_seqs / P requests each, then with one batch of up to
max_num_seqs at a time (the queue sized 1, which reads each batch's tokens before scheduling
the next: the pipeline before the batch queue). Reports wall time, the process's CPU time,
output tokens per second and whether the two runs gave the same tokens.

    python benchmarks/pipeline.py [--model PATH] [--num-requests 16] [--output-len 32]
        [--pipeline-parallel-size 2] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="Default: SmolLM2-135M-Instruct (GGUF).")
    p.add_argument("--num-requests", type=int, default=16)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--pipeline-parallel-size", type=int, default=2)
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    pp = ns.pipeline_parallel_size
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={pp}")
    from jaxvllm import LLM, SamplingParams
    from jaxvllm.engine.batch_queue import BatchQueue

    llm = LLM(ns.model, pipeline_parallel_size=pp, max_num_seqs=ns.max_num_seqs,
              max_num_batched_tokens=ns.max_num_seqs * ns.input_len, max_model_len=512, skip_warmup=True,
              num_gpu_blocks_override=ns.num_requests * (ns.input_len + ns.output_len) // 16 + 8)
    core = llm.llm_engine.engine_core
    prompts = [{"prompt_token_ids": [(7 * i + j) % 1000 + 10 for j in range(ns.input_len)]}
               for i in range(ns.num_requests)]
    greedy = SamplingParams(temperature=0, max_tokens=ns.output_len, ignore_eos=True)
    result, tokens = {"pipeline_parallel_size": pp, "num_requests": ns.num_requests,
                      "input_len": ns.input_len, "output_len": ns.output_len}, {}
    for _timed in (False, True):  # the first pass compiles the buckets each way uses
        for name, size in (("batch_queue", pp), ("one_batch", 1)):
            core.batch_queue = BatchQueue(size)
            core.scheduler.in_flight.max_batch_reqs = -(-ns.max_num_seqs // size)
            wall, cpu = time.perf_counter(), time.process_time()
            outputs = llm.generate(prompts, greedy, use_tqdm=False)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            tokens[name] = [o.outputs[0].token_ids for o in outputs]
            result[name] = {"wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                            "out_tok_per_s": round(ns.num_requests * ns.output_len / wall, 1),
                            "max_in_flight": core.batch_queue.max_in_flight}
    result["speedup"] = round(result["one_batch"]["wall_s"] / result["batch_queue"]["wall_s"], 3)
    result["same_tokens"] = tokens["batch_queue"] == tokens["one_batch"]
    print(json.dumps(result, indent=2))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
