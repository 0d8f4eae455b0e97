"""The OffloadingConnector's host tier against recompute, in one run: a device pool too small
for the working set, `--num-prefixes` distinct prefixes of `--prefix-len` tokens, each asked
`--asks` times (a short distinct tail each time) in shuffled order, one request at a time, so
that a request's time to first token is its own prefill (or load). Both engines keep prefix
caching on: the device pool serves what it still holds, and only with the connector does an
evicted prefix come back from host memory instead of being computed again. Greedy outputs are
compared token for token; the host tier's hits and bytes are the connector's counters.

    python benchmarks/kv_offload.py                          # default model, 16 x 1500 tokens x 4
    python benchmarks/kv_offload.py --num-gpu-blocks 256 --json r.json
    python benchmarks/kv_offload.py --model /tmp/llama3-8b-random --num-prefixes 2 --prefix-len 32768 \
        --asks 2 --order round-robin --num-gpu-blocks 2100 --max-model-len 33024  # the device check's
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time


def make_prompts(vocab_size: int, num_prefixes: int, prefix_len: int, asks: int, tail: int,
                 order: str = "shuffled", seed: int = 0):
    """round-robin: every prefix once, then again, ... (each ask comes after all the others)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(100, vocab_size) for _ in range(prefix_len)] for _ in range(num_prefixes)]
    prompts = [p + [rng.randrange(100, vocab_size) for _ in range(tail)] for _ in range(asks) for p in prefixes]
    if order == "shuffled":
        rng.shuffle(prompts)
    return prompts


def run_sequentially(llm, prompts, params) -> tuple[list[list[int]], list[float]]:
    """Each request alone: its TTFT is from add_request to the step that returns its first token."""
    engine = llm.llm_engine
    outputs, ttfts = [], []
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        engine.add_request(f"r{i}", {"prompt_token_ids": prompt}, params)
        first = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter() - start
                if out.finished:
                    outputs.append(list(out.outputs[0].token_ids))
        ttfts.append(first)
    return outputs, ttfts


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--num-prefixes", type=int, default=16)
    p.add_argument("--prefix-len", type=int, default=1500)
    p.add_argument("--asks", type=int, default=4)
    p.add_argument("--order", choices=["shuffled", "round-robin"], default="shuffled")
    p.add_argument("--tail", type=int, default=16, help="distinct tokens after the prefix per request")
    p.add_argument("--output-len", type=int, default=8)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-gpu-blocks", type=int, default=256, help="the device pool (too small on purpose)")
    p.add_argument("--num-cpu-blocks", type=int, default=None,
                   help="the host tier (default: every prefix, in every KV cache group)")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--skip-warmup", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from jaxvllm import LLM, SamplingParams
    from jaxvllm.transformers_utils.config import load_hf_config
    from jaxvllm.transformers_utils.model_path import resolve_model

    model = resolve_model(args.model)
    prompts = make_prompts(load_hf_config(model).vocab_size, args.num_prefixes, args.prefix_len, args.asks,
                           args.tail, args.order)
    blocks_per_prompt = -(-(args.prefix_len + args.tail + args.output_len) // args.block_size)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    engine_args = dict(max_model_len=args.max_model_len, max_num_seqs=1, block_size=args.block_size,
                       num_gpu_blocks_override=args.num_gpu_blocks, skip_warmup=args.skip_warmup,
                       **({"max_num_batched_tokens": args.max_num_batched_tokens}
                          if args.max_num_batched_tokens else {}))
    rows, num_cpu_blocks = {}, args.num_cpu_blocks
    for name in ("recompute", "offload"):
        extra = {} if name == "recompute" else {"kv_transfer_config": {
            "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"num_cpu_blocks": num_cpu_blocks}}}
        llm = LLM(model, **engine_args, **extra)
        if num_cpu_blocks is None:  # every prefix, in each KV cache group (a hybrid model has several)
            num_groups = len(llm.llm_engine.engine_core.scheduler.kv_cache_manager.managers)
            num_cpu_blocks = args.num_prefixes * blocks_per_prompt * num_groups
        outputs, ttfts = run_sequentially(llm, prompts, params)
        s = llm.llm_engine.get_stats()
        rows[name] = dict(outputs=outputs, ttft_median_s=statistics.median(ttfts), ttft_p90_s=percentile(ttfts, 90),
                          ttft_mean_s=statistics.mean(ttfts), prefill_tokens=s.num_prefill_tokens,
                          device_prefix_hits=s.prefix_cache_hits, connector=s.kv_connector_stats)
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    rec, off = rows["recompute"], rows["offload"]
    kv = off["connector"]
    result = dict(
        model=model, num_prefixes=args.num_prefixes, prefix_len=args.prefix_len, asks=args.asks, order=args.order,
        requests=len(prompts), num_gpu_blocks=args.num_gpu_blocks, num_cpu_blocks=num_cpu_blocks,
        identical_outputs=rec["outputs"] == off["outputs"],
        host_tier_hit_tokens=kv.get("external_prefix_cache_hits", 0),
        **{f"{k}_{name}": rows[name][k] for name in rows for k in
           ("ttft_median_s", "ttft_p90_s", "ttft_mean_s", "prefill_tokens", "device_prefix_hits")},
        ttft_median_speedup=rec["ttft_median_s"] / off["ttft_median_s"],
        ttft_p90_speedup=rec["ttft_p90_s"] / off["ttft_p90_s"],
        connector=kv)
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
