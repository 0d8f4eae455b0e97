"""Large models' decode step compiled by libtpu for TPU slices on this CPU (no TPU: compile-only
chips, jaxvllm/aot_compile.py): compile time, the HBM plan, and the decode throughput the
chip's roofline predicts for 64 sequences of 2k context. PREDICTIONS, NOT MEASUREMENTS: the
roofline (jaxvllm/roofline.py) is the larger of the bytes the step must move (weights once,
the KV read for the stated context, activations) over HBM bandwidth and its flops over the
peak, with Google's published per-chip figures.

    python benchmarks/tpu_compile.py --json benchmarks/results/tpu-compile.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.aot_compile import compile_for_target  # noqa: E402

SEQS, CONTEXT = 64, 2048
# Hugging Face config.json fields of the published models (no weights are read).
MODELS = {
    "Llama-3-8B": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                       hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                       tie_word_embeddings=False, max_position_embeddings=8192),
    "Llama-3.1-8B": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                         hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                         rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192),
                         tie_word_embeddings=False, max_position_embeddings=131072),
    "Qwen3-8B": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False,
                     max_position_embeddings=40960),
    "Qwen3-30B-A3B": dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", vocab_size=151936,
                          hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, rms_norm_eps=1e-6,
                          rope_theta=1e6, tie_word_embeddings=False, max_position_embeddings=40960),
    "Gemma-3-27B": dict(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", vocab_size=262208,
                        hidden_size=5376, intermediate_size=21504, num_hidden_layers=62, num_attention_heads=32,
                        num_key_value_heads=16, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                        rope_local_base_freq=10000.0, sliding_window=1024, query_pre_attn_scalar=168,
                        max_position_embeddings=131072),
}
# (model, variant label, engine arguments beyond the decode shape)
RUNS = [("Llama-3-8B", "bf16", {}), ("Llama-3-8B", "int8 weights", dict(quantization="int8")),
        ("Llama-3-8B", "fp8 KV", dict(kv_cache_dtype="fp8")),
        ("Qwen3-30B-A3B", "bf16, EP", dict(enable_expert_parallel=True)), ("Gemma-3-27B", "bf16", {})]
DECODE = dict(max_num_seqs=SEQS, max_num_batched_tokens=SEQS, max_model_len=2 * CONTEXT)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--targets", nargs="+", default=["tpu-v5e-8", "tpu-v6e-8", "tpu-v5p-8"])
    p.add_argument("--models", nargs="+", default=sorted(MODELS), choices=sorted(MODELS))
    p.add_argument("--variants", nargs="+", default=None, choices=sorted({v for _, v, _ in RUNS}))
    p.add_argument("--json")
    ns = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model, variant, extra in RUNS:
            if model not in ns.models or (ns.variants and variant not in ns.variants):
                continue
            path = os.path.join(tmp, model)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(MODELS[model], f)
            for target in ns.targets:
                row = dict(model=model, variant=variant, target=target)
                try:
                    report = compile_for_target(path, target, programs=(f"forward T={SEQS}", f"sample R={SEQS}"),
                                                context=CONTEXT, **DECODE, **extra)
                except ValueError as e:  # does not fit: the refusal is the row
                    rows.append(dict(row, error=str(e)))
                    print(f"{model:14s} {variant:13s} {target:10s} refused: {e}", flush=True)
                    continue
                forward = next(r for r in report["programs"] if r["program"].startswith("forward"))
                row.update(compiled=all(r["compiled"] for r in report["programs"]), fits=report["fits"],
                           weights_gib=report["weights_bytes"] / 2**30, kv_blocks=report["kv_blocks"],
                           max_concurrency=report["max_concurrency"], wall_s=report["wall_s"],
                           compile_s={r["program"]: r["compile_s"] for r in report["programs"]},
                           errors=[r["error"] for r in report["programs"] if r["error"]],
                           predicted_decode_tok_s=SEQS / forward["predicted_s"] if forward["compiled"] else None)
                rows.append(row)
                pred = row["predicted_decode_tok_s"]
                print(f"{model:14s} {variant:13s} {target:10s} compiled={row['compiled']} fits={row['fits']} "
                      f"weights {row['weights_gib']:.2f} GiB/chip, {row['kv_blocks']} blocks, "
                      f"max_concurrency {row['max_concurrency']}, {row['wall_s']:.0f} s, "
                      f"predicted {pred and round(pred):} tok/s (prediction, not a measurement)", flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(dict(note="predicted_decode_tok_s: roofline predictions, not measurements; "
                                f"{SEQS} sequences of {CONTEXT} tokens of context", rows=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
