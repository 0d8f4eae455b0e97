"""Accuracy of each weight and KV cache format against float32, on the default model: per
token logprobs of a fixed held-out text (benchmarks/data/heldout.txt, written for this and
in no training set we know of), their mean absolute difference from float32's, perplexity,
and greedy agreement on a prompt set, with the bytes each format takes; one table.

Greedy agreement is measured twice: along the held-out text, the share of positions whose
most likely next token is float32's (each position sees the same true prefix); and on the
prompts, the share of generated tokens equal to float32's up to the first that differs (after
it the two continue from different text). Matmul bytes are the decoder layers' linears (the
default model's LM head is its embedding: float32 in every format).

    python benchmarks/quality.py [--max-tokens 32] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm import LLM, SamplingParams  # noqa: E402
from jaxvllm.transformers_utils.model_path import resolve_model  # noqa: E402
from jaxvllm.transformers_utils.tokenizer import load_tokenizer  # noqa: E402

TEXT = Path(__file__).resolve().parent / "data" / "heldout.txt"
PROMPTS = [
    "The three primary colours are",
    "To make a cup of tea, first",
    "Water boils at a temperature of",
    "The largest planet in our solar system is",
    "A good way to learn a new language is",
    "In the morning, the market square",
    "The recipe calls for two eggs, a cup of flour and",
    "When the train finally arrived at the station,",
]
# (label, quantization, kv_cache_dtype); the first row is the reference.
FORMATS = [("float32", None, "auto"), ("int8 weights", "int8", "auto"), ("fp8 weights", "fp8", "auto"),
           ("fp8 KV", None, "fp8"), ("fp8_e5m2 KV", None, "fp8_e5m2"), ("int8 KV", None, "int8"),
           ("int8 weights + fp8 KV", "int8", "fp8")]
MATMULS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def measure(quantization, kv_cache_dtype, text_ids, max_tokens, model) -> dict:
    llm = LLM(model, dtype="float32", quantization=quantization, kv_cache_dtype=kv_cache_dtype,
              max_model_len=1024, skip_warmup=True, enable_prefix_caching=False)
    worker = llm.llm_engine.engine_core.model_executor.driver_worker
    params = worker.model_runner.params
    matmul = sum(x.nbytes for path, x in jax.tree_util.tree_leaves_with_path(params)
                 if any(getattr(k, "key", None) in MATMULS for k in path))
    scored = llm.generate([{"prompt_token_ids": text_ids}],
                          SamplingParams(max_tokens=1, prompt_logprobs=1, temperature=0.0), use_tqdm=False)[0]
    logprobs = [entry[tok].logprob for tok, entry in zip(text_ids[1:], scored.prompt_logprobs[1:])]
    top1 = [next(t for t, lp in entry.items() if lp.rank == 1) for entry in scored.prompt_logprobs[1:]]
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                          use_tqdm=False)
    return dict(matmul_weight_bytes=matmul, kv_blocks=int(worker.model_runner.kv_cache.shape[2]),
                kv_bytes_per_block=worker.block_bytes, logprobs=logprobs, top1=top1,
                greedy=[list(o.outputs[0].token_ids) for o in greedy])


def agreement(ref: list[list[int]], got: list[list[int]]) -> float:
    shares = []
    for a, b in zip(ref, got):
        same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        shares.append(same / len(a))
    return float(np.mean(shares))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="Default: SmolLM2-135M-Instruct (GGUF).")
    p.add_argument("--max-tokens", type=int, default=32, help="greedy tokens per prompt")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    rows, ref = [], None
    text_ids = load_tokenizer(resolve_model(ns.model)).encode(TEXT.read_text())
    for label, quantization, kv in FORMATS:
        start = time.perf_counter()
        r = measure(quantization, kv, text_ids, ns.max_tokens, ns.model)
        ref = ref or r
        lp, ref_lp = np.array(r["logprobs"]), np.array(ref["logprobs"])
        rows.append(dict(format=label, quantization=quantization, kv_cache_dtype=kv,
                         matmul_weight_bytes=r["matmul_weight_bytes"],
                         weight_ratio_vs_float32=r["matmul_weight_bytes"] / ref["matmul_weight_bytes"],
                         kv_bytes_per_block=r["kv_bytes_per_block"], kv_blocks=r["kv_blocks"],
                         kv_blocks_vs_bfloat16=r["kv_blocks"] / (2 * ref["kv_blocks"]),
                         perplexity=math.exp(-lp.mean()),
                         perplexity_change=math.exp(-lp.mean()) / math.exp(-ref_lp.mean()) - 1,
                         mean_abs_dlogprob=float(np.abs(lp - ref_lp).mean()),
                         top1_agreement=float(np.mean(np.array(r["top1"]) == np.array(ref["top1"]))),
                         greedy_agreement=agreement(ref["greedy"], r["greedy"]),
                         seconds=time.perf_counter() - start))
        print(f"{label}: done in {rows[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
    print(f"{len(text_ids)} held-out tokens, {len(PROMPTS)} prompts x {ns.max_tokens} greedy tokens; "
          "KV blocks for the CPU's 1 GiB budget (bfloat16's are float32's x 2)")
    head = ("format", "matmul MiB", "x f32", "KV blocks", "x bf16", "perplexity", "vs f32", "mean|dlogp|",
            "top-1 on text", "greedy prefix")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['format']} | {r['matmul_weight_bytes'] / 2**20:.1f} | {r['weight_ratio_vs_float32']:.3f} | "
              f"{r['kv_blocks']} | {r['kv_blocks_vs_bfloat16']:.2f} | {r['perplexity']:.3f} | "
              f"{100 * r['perplexity_change']:+.2f}% | {r['mean_abs_dlogprob']:.4f} | "
              f"{100 * r['top1_agreement']:.1f}% | {100 * r['greedy_agreement']:.1f}% |")
    if ns.json:
        Path(ns.json).write_text(json.dumps(dict(tokens=len(text_ids), rows=rows), indent=1))


if __name__ == "__main__":
    main()
