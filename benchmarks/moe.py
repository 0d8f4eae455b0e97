"""The mixture-of-experts layer (jaxvllm/layers/fused_moe.py): the platform's grouped matmul
against the dense reference (every expert over every token) and against a dense MLP with as
many active parameters (intermediate size top_k x the expert's: the FLOPs a token really
needs), in tokens/s per layer over a range of token counts.

Each variant includes the router (softmax, top-k) where it has one. Prints a table and writes
a JSON result.

    python benchmarks/moe.py                          # this machine's default shape
    python benchmarks/moe.py --shape mixtral-8x7b     # one real layer (on an accelerator)
    python benchmarks/moe.py --smoke                  # tiny shapes, a few calls (CI)
    XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/moe.py --ep 4

`--ep N` instead times the layer with its experts split over N devices two ways, and lists
each compiled program's collectives: the engine's (`fused_moe`: per device under shard_map,
one all-reduce) and XLA's own partitioning of the unsharded layer (ragged_dot over experts
sharded on the mesh, XLA's collectives).
"""
from __future__ import annotations

import argparse
import json
import platform as _platform
import re
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.machine import engine_backend  # noqa: E402
from jaxvllm.distributed.mesh import MODEL_AXIS as M  # noqa: E402
from jaxvllm.distributed.mesh import make_mesh
from jaxvllm.layers.fused_moe import UnquantizedFusedMoEMethod, dense_moe, fused_moe, select_experts  # noqa: E402
from jaxvllm.platforms import current_platform  # noqa: E402

COLLECTIVES = ("all-reduce", "all-to-all", "all-gather", "reduce-scatter", "collective-permute")

# name: (hidden, expert intermediate, experts, top_k)
SHAPES = {
    "small": (512, 1024, 8, 2),          # Mixtral's proportions, scaled for a 2-core CPU
    "mixtral-8x7b": (4096, 14336, 8, 2),
    "qwen3-30b-a3b": (2048, 768, 128, 8),
    "smoke": (64, 96, 8, 2),
}
TOKENS = [1, 16, 64, 256, 512]
SMOKE_TOKENS = [1, 8]


def make_layer(rng, hidden, inter, experts, top_k, dtype):
    def w(fan_in, *shape):
        return jnp.asarray(rng.standard_normal(shape) * fan_in ** -0.5, dtype)
    return dict(router=w(hidden, hidden, experts), gate_up=w(hidden, experts, hidden, 2, inter),
                down=w(inter, experts, inter, hidden), dense_gate_up=w(hidden, hidden, 2, top_k * inter),
                dense_down=w(top_k * inter, top_k * inter, hidden))


def variants(top_k: int, renormalize: bool = True):
    """name -> f(weights, x): the three layers compared, and XLA's ragged_dot where the
    backend's grouped matmul is another (why it is)."""
    method = engine_backend().moe_method

    def routed(w, x):
        return select_experts(x @ w["router"], top_k, renormalize)

    def grouped(w, x):  # the experts as the method stores them (packed on one CPU device)
        return method.apply(x, w["stored_gate_up"], w["stored_down"], *routed(w, x))

    def dense_reference(w, x):
        return dense_moe(x, w["gate_up"], w["down"], *routed(w, x))

    def dense_mlp(w, x):
        gate_up = jnp.einsum("th,hci->tci", x, w["dense_gate_up"])
        return (jax.nn.silu(gate_up[:, 0]) * gate_up[:, 1]) @ w["dense_down"]

    fns = {"grouped": grouped, "dense_reference": dense_reference, "dense_mlp": dense_mlp}
    if method.grouped_matmul is not jax.lax.ragged_dot:
        ragged = UnquantizedFusedMoEMethod()
        fns["ragged_dot"] = lambda w, x: ragged.apply(x, w["gate_up"], w["down"], *routed(w, x))
    return fns


def collectives(hlo: str) -> dict[str, int]:
    """Collective ops of a compiled HLO module (async pairs counted once, by their start)."""
    ops = re.findall(r"= \S+ (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", hlo)
    return {op: ops.count(op) for op in COLLECTIVES if op in ops}


def time_call(fn, *args, calls: int) -> float:
    """Median seconds per call after one warm call (the compile)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def run(shape: str, tokens: list[int], dtype, calls: int) -> list[dict]:
    hidden, inter, experts, top_k = SHAPES[shape]
    rng = np.random.default_rng(0)
    w = make_layer(rng, hidden, inter, experts, top_k, dtype)
    method = engine_backend().moe_method
    w.update(stored_gate_up=method.process_weights_after_loading(w["gate_up"]),
             stored_down=method.process_weights_after_loading(w["down"]))
    fns = {name: jax.jit(f) for name, f in variants(top_k).items()}
    rows = []
    for T in tokens:
        x = jnp.asarray(rng.standard_normal((T, hidden)), dtype)
        row = dict(tokens=T)
        outs = {}
        for name, fn in fns.items():
            seconds = time_call(fn, w, x, calls=calls)
            row[f"{name}_ms"] = seconds * 1e3
            row[f"{name}_tok_s"] = T / seconds
            outs[name] = np.asarray(fn(w, x), np.float32)
        ref = outs["dense_reference"]
        row["max_rel_err"] = float(np.abs(outs["grouped"] - ref).max() / max(np.abs(ref).max(), 1e-30))
        rows.append(row)
        print(f"{T:>6} tokens  " + "  ".join(f"{name} {row[f'{name}_tok_s']:.0f} tok/s" for name in fns)
              + f"  rel err {row['max_rel_err']:.1e}", flush=True)
    return rows


def run_ep(shape: str, tokens: list[int], dtype, calls: int, ep: int) -> list[dict]:
    """The layer with its experts split over `ep` devices: the engine's shard_map against
    XLA's partitioning of the unsharded layer."""
    hidden, inter, experts, top_k = SHAPES[shape]
    mesh = make_mesh(ep)
    rng = np.random.default_rng(0)
    split = {"gate_up": P(M, None, None, None), "down": P(M, None, None)}
    w = {name: jax.device_put(v, NamedSharding(mesh, split.get(name, P())))
         for name, v in make_layer(rng, hidden, inter, experts, top_k, dtype).items()}
    platform_method, ragged = engine_backend().moe_method, UnquantizedFusedMoEMethod()

    def engine(w, x):
        return fused_moe(platform_method, x, w["gate_up"], w["down"], *select_experts(x @ w["router"], top_k, True),
                         expert_parallel=True)

    def xla(w, x):
        return ragged.apply(x, w["gate_up"], w["down"], *select_experts(x @ w["router"], top_k, True))

    def jitted(fn):
        def traced(w, x):
            with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
                return fn(w, x)
        rep = NamedSharding(mesh, P())
        return jax.jit(traced, in_shardings=(jax.tree.map(lambda a: a.sharding, w), rep), out_shardings=rep)

    fns = {"engine_shard_map": jitted(engine), "xla_partitioned": jitted(xla)}
    rows = []
    for T in tokens:
        x = jax.device_put(jnp.asarray(rng.standard_normal((T, hidden)), dtype), NamedSharding(mesh, P()))
        row = dict(tokens=T, ep=ep)
        for name, fn in fns.items():
            row[f"{name}_tok_s"] = T / time_call(fn, w, x, calls=calls)
            row[f"{name}_collectives"] = collectives(fn.lower(w, x).compile().as_text())
        ref, ours = np.asarray(fns["xla_partitioned"](w, x)), np.asarray(fns["engine_shard_map"](w, x))
        row["max_rel_err"] = float(np.abs(ours - ref).max() / max(np.abs(ref).max(), 1e-30))
        rows.append(row)
        print(f"{T:>6} tokens EP={ep}  engine (shard_map) {row['engine_shard_map_tok_s']:>9.0f} tok/s "
              f"{row['engine_shard_map_collectives']}  XLA-partitioned {row['xla_partitioned_tok_s']:>9.0f} tok/s "
              f"{row['xla_partitioned_collectives']}  rel err {row['max_rel_err']:.1e}", flush=True)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default=None,
                   help="default: small on a CPU, mixtral-8x7b on an accelerator")
    p.add_argument("--tokens", type=int, nargs="+", default=None)
    p.add_argument("--dtype", default=None, help="default: the platform's")
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="tiny shapes, two calls each")
    p.add_argument("--ep", type=int, default=None, help="experts split over this many devices")
    p.add_argument("--out", default=None, help="JSON result path")
    a = p.parse_args(argv)
    on_cpu = current_platform.device_name == "cpu"
    shape = "smoke" if a.smoke else a.shape or ("small" if on_cpu else "mixtral-8x7b")
    tokens = a.tokens or (SMOKE_TOKENS if a.smoke else TOKENS)
    dtype = jnp.dtype(a.dtype or current_platform.default_dtype)
    hidden, inter, experts, top_k = SHAPES[shape]
    device = jax.devices()[0]
    print(f"MoE layer {shape}: hidden {hidden}, {experts} experts of {inter}, top-{top_k}, {dtype.name}, "
          f"on {device.device_kind} ({_platform.node()})")
    calls = 2 if a.smoke else a.calls
    result = dict(shape=shape, hidden=hidden, intermediate=inter, experts=experts, top_k=top_k,
                  dtype=dtype.name, device=device.device_kind,
                  rows=run_ep(shape, tokens, dtype, calls, a.ep) if a.ep else run(shape, tokens, dtype, calls))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
