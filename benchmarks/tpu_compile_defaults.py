"""`jaxvllm compile` as a new user runs it: published configs (benchmarks/tpu_compile.py MODELS,
no weights) at the context they ship with and the engine's TPU defaults (256 sequences, 2,048
tokens a step), every warmed program compiled by libtpu for the slice; then each forward bucket
at 256 and 4,096 KV blocks, bfloat16 and fp8 KV, to show its temporaries do not grow with the
pool. predicted_s are roofline predictions (jaxvllm/roofline.py), not measurements.

    python benchmarks/tpu_compile_defaults.py --json benchmarks/results/tpu-compile-defaults.json
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
from tpu_compile import MODELS  # noqa: E402

from jaxvllm.aot_compile import compile_for_target  # noqa: E402

RUNS = [("Llama-3.1-8B", "tpu-v6e-4", {}), ("Llama-3.1-8B", "tpu-v5e-8", {}), ("Qwen3-8B", "tpu-v6e-1", {}),
        ("Gemma-3-27B", "tpu-v6e-8", {}), ("Qwen3-30B-A3B", "tpu-v5p-8", dict(enable_expert_parallel=True))]
POOLS = (256, 4096)


def summary(report: dict) -> dict:
    keys = ("target", "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens", "fits",
            "weights_bytes", "kv_blocks", "kv_cache_bytes", "peak_step_bytes", "max_concurrency", "compile_threads",
            "compile_s", "compile_wall_s", "wall_s")
    rows = report["programs"]
    return dict({k: report[k] for k in keys}, programs=len(rows), compiled=sum(r["compiled"] for r in rows),
                errors=[(r["program"], r["error"]) for r in rows if not r["compiled"]])


def pool_temporaries(path: str, target: str, extra: dict, kv_cache_dtype: str, threads: int) -> dict:
    """Each forward bucket's temporaries (MiB per chip) at each pool size, and the largest growth."""
    temps = {}
    for blocks in POOLS:
        report = compile_for_target(path, target, programs=("forward",), kv_cache_dtype=kv_cache_dtype,
                                    num_gpu_blocks_override=blocks, compile_threads=threads, **extra)
        temps[blocks] = {r["program"]: r["temp_bytes"] / 2**20 for r in report["programs"] if r["compiled"]}
    small, large = temps[POOLS[0]], temps[POOLS[-1]]
    growth = max((large[p] - small[p]) / max(small[p], 1e-9) for p in small) if small.keys() == large.keys() else None
    return dict(kv_cache_dtype=kv_cache_dtype, temp_mib={str(b): t for b, t in temps.items()}, max_growth=growth)


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", type=int, default=list(range(len(RUNS))),
                   help=f"indices into {[f'{m} on {t}' for m, t, _ in RUNS]}")
    p.add_argument("--skip-pools", action="store_true", help="only the every-program compile")
    p.add_argument("--results-dir", default=str(Path(__file__).resolve().parent / "results"),
                   help="each run's full report is written here too")
    # One by default: on this 2-core machine two at once crashed libtpu twice (a stack overflow
    # in its SparseCore code generator, on its own fiber threads: Llama-3.1-8B on v6e-4 and
    # Qwen3-8B on v6e-1); a 15-minute rerun with two did not, so it is not pinned down.
    p.add_argument("--compile-threads", type=int, default=1)
    p.add_argument("--json")
    ns = p.parse_args(argv)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in ns.runs:
            model, target, extra = RUNS[i]
            path = os.path.join(tmp, model)
            os.makedirs(path, exist_ok=True)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(MODELS[model], f)
            row = dict(model=model, **extra)
            try:
                report = compile_for_target(path, target, compile_threads=ns.compile_threads, **extra)
            except ValueError as e:
                out.append(dict(row, target=target, error=str(e)))
                print(f"{model} on {target}: refused: {e}", flush=True)
                continue
            report["model"] = f"{model} shapes (benchmarks/tpu_compile.py MODELS; config.json only)"
            with open(os.path.join(ns.results_dir, f"tpu-defaults-{model.lower()}-{target}.json"), "w") as f:
                json.dump(report, f, indent=1)
            row.update(summary(report))
            if not ns.skip_pools:
                row["pools"] = [pool_temporaries(path, target, extra, kv, ns.compile_threads) for kv in ("auto", "fp8")]
            out.append(row)
            print(json.dumps(row), flush=True)
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(dict(note="predicted_s: roofline predictions, not measurements", runs=out), f, indent=1)
    return out


if __name__ == "__main__":
    main()
