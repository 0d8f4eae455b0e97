"""The family matrix: every architecture the registry serves, at one shared shape (SmolLM2's
sizes by default, random weights; benchmarks/family_configs.py gives each its features), timed
in one run, each as a ratio to Llama's, so that a family-specific slow path shows up as a ratio.

Per family: the forward step the engine compiles (the platform's layer loop, attention kernel
and matmul) plus a greedy pick over the LM head, at decode batch 1 and batch 64 (each sequence
at `--context` tokens) and one prefill of `--prefill` tokens; and decode batch 1 again with
the KV cache as large as the engine's default pool (1 GiB on a CPU) against one of `--blocks`
blocks: a step that copies the cache grows with the pool. The cases are timed in turn, step by
step, so that the machine's slower spells fall on all of them alike.

    python benchmarks/families.py [--shape smollm2] [--steps 10] [--json benchmarks/results/families.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.family_configs import ARCHITECTURES, family_args  # noqa: E402
from benchmarks.machine import engine_backend  # noqa: E402
from benchmarks.model_shapes import SHAPES  # noqa: E402
from benchmarks.model_step import step_inputs  # noqa: E402
from jaxvllm.layers.attention import get_attention  # noqa: E402
from jaxvllm.platforms import current_platform  # noqa: E402


def random_model(model_cls, args, dtype, key):
    """(graphdef, params) of model_cls with N(0, 0.02) weights (norms at their identity plus
    noise), stored as the backend's linear method stores them (packed, on a CPU with AVX-512)."""
    backend = engine_backend(dtype=dtype)
    abstract = nnx.eval_shape(lambda: model_cls(args, dtype=dtype, linear_method=backend.linear_method,
                                                moe_method=backend.moe_method))
    graphdef, params = nnx.split(abstract)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    draw = jax.jit(lambda k, shape: 0.02 * jax.random.normal(k, shape, dtype), static_argnums=1)
    return graphdef, jax.tree_util.tree_unflatten(
        treedef, [draw(jax.random.fold_in(key, i), leaf.shape) for i, leaf in enumerate(leaves)])


def prepare_case(step, params, args, dtype, seqs, q_len, context, num_pages, seed):
    """A call of one step (compiled once, the cache donated as the engine does), warmed."""
    ids, kv_cache, md, rows = step_inputs(args, seqs, q_len, context, 16, dtype, jax.random.key(seed))
    if num_pages > kv_cache.shape[2]:  # the rest of a larger pool, never read
        kv_cache = jnp.pad(kv_cache, ((0, 0), (0, 0), (0, num_pages - kv_cache.shape[2])) + ((0, 0),) * 3)
    compiled = jax.jit(step, donate_argnums=(2,)).lower(params, ids, kv_cache, md, rows).compile()
    state = {"kv": kv_cache}

    def call():
        tokens, state["kv"] = compiled(params, ids, state["kv"], md, rows)
        tokens.block_until_ready()
    call()
    return call


def median_seconds(calls: dict, steps: int) -> dict:
    """Median seconds of each call, the calls taken in turn `steps` times: a slower spell of
    the machine falls on every case alike, not on whichever ran during it."""
    times = {name: [] for name in calls}
    for _ in range(steps):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def run_family(arch, shape, dtype, ns, seed) -> dict:
    model_cls, args = family_args(arch, shape)
    graphdef, params = random_model(model_cls, args, dtype, jax.random.key(seed))
    backend = engine_backend(dtype=dtype)
    attend = get_attention(backend.attention_impl, current_platform.kv_cache_layout)  # pages in the model's dtype

    def step(params, input_ids, kv_cache, md, logits_indices):
        model = nnx.merge(graphdef, params)
        hidden, kv_cache = model(input_ids, kv_cache, md, attend, backend.layer_loop)
        return jnp.argmax(model.compute_logits(hidden[logits_indices]), axis=-1), kv_cache

    block_bytes = args.num_layers * 2 * 16 * args.num_kv_heads * args.head_dim * dtype.itemsize
    default_blocks = current_platform.default_kv_cache_memory_bytes // block_bytes
    row = dict(arch=arch, layers=args.num_layers, kv_heads=args.num_kv_heads, head_dim=args.head_dim,
               default_pool_blocks=int(default_blocks))
    cases = {"decode_1": (1, 1, ns.context, 0), "decode_64": (64, 1, ns.context, 0),
             "prefill": (1, ns.prefill, ns.prefill, 0),
             "decode_1_small_pool": (1, 1, ns.context, ns.blocks),
             "decode_1_default_pool": (1, 1, ns.context, default_blocks)}
    # The three decode-1 cases share their inputs: they differ in the pool's size only.
    calls = {name: prepare_case(step, params, args, dtype, seqs, q_len, context, pages,
                                0 if name.startswith("decode_1") else i)
             for i, (name, (seqs, q_len, context, pages)) in enumerate(cases.items())}
    for name, seconds in median_seconds(calls, ns.steps).items():
        row[f"{name}_ms"] = 1e3 * seconds
    row["pool_ratio"] = row["decode_1_default_pool_ms"] / row["decode_1_small_pool_ms"]
    print(f"  {arch:<22}" + "".join(f"{row[f'{c}_ms']:>10.2f}" for c in cases) + f"{row['pool_ratio']:>8.2f}",
          flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES))
    ap.add_argument("--archs", default=",".join(ARCHITECTURES), help="comma-separated (default: all)")
    ap.add_argument("--context", type=int, default=256, help="decode: each sequence's context")
    ap.add_argument("--prefill", type=int, default=512, help="prefill: prompt length")
    ap.add_argument("--blocks", type=int, default=128, help="the small pool")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", metavar="PATH")
    ns = ap.parse_args(argv)
    shape, dtype = SHAPES[ns.shape], jnp.dtype(current_platform.default_dtype)
    archs = ns.archs.split(",")
    if "LlamaForCausalLM" not in archs:
        archs.insert(0, "LlamaForCausalLM")  # the reference
    print(f"family matrix: {ns.shape} shape, {dtype.name}, {jax.devices()[0].device_kind}, jax {jax.__version__}; "
          f"ms per step (median of {ns.steps})")
    print(f"  {'arch':<22}{'dec 1':>10}{'dec 64':>10}{'prefill':>10}{'pool 128':>10}{'pool dflt':>10}{'dflt/128':>8}")
    result = dict(shape=ns.shape, dtype=dtype.name, device=jax.devices()[0].device_kind, jax=jax.__version__,
                  context=ns.context, prefill=ns.prefill, small_pool_blocks=ns.blocks, steps=ns.steps, rows=[])
    rows = result["rows"]
    for seed, arch in enumerate(archs):
        rows.append(run_family(arch, shape, dtype, ns, seed))
        jax.clear_caches()  # each family's programs and the arrays they hold: one run saw 8.5 GB
        if ns.json:  # after each family: a long run interrupted keeps what it measured
            Path(ns.json).write_text(json.dumps(result, indent=1))
    llama = next(r for r in rows if r["arch"] == "LlamaForCausalLM")
    print("\nratio to Llama (same run):")
    print(f"  {'arch':<22}{'dec 1':>8}{'dec 64':>8}{'prefill':>8}{'dflt/128 pool':>15}")
    for r in rows:
        for c in ("decode_1", "decode_64", "prefill"):
            r[f"{c}_vs_llama"] = r[f"{c}_ms"] / llama[f"{c}_ms"]
        print(f"  {r['arch']:<22}{r['decode_1_vs_llama']:>8.2f}{r['decode_64_vs_llama']:>8.2f}"
              f"{r['prefill_vs_llama']:>8.2f}{r['pool_ratio']:>15.2f}")
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
