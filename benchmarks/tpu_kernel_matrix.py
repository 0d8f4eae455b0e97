"""The TPU attention kernel compiled by libtpu's Mosaic for compile-only chips (no TPU needed,
the `tpu` extra): every KV dtype the engine offers x head dim x GQA group x (plain, sliding
window with soft-cap) x step shape (up to 512 sequences of 128k context) x chip, in the TPU
platform's KV layout. A cell is a compile, not a run:
interpret-mode tests check the numbers.

    python benchmarks/tpu_kernel_matrix.py --json benchmarks/results/tpu-kernel-matrix.json
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # the compile-only TPU devices need no TPU backend
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.backends import get_backend  # noqa: E402
from jaxvllm.config import EngineConfig, ModelConfig  # noqa: E402
from jaxvllm.platforms import get_platform  # noqa: E402
from jaxvllm.platforms.tpu_targets import CHIPS  # noqa: E402
from pallas_kernels import ragged_paged_attention_tpu as tpu  # noqa: E402

KV_DTYPES = {"bf16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn, "int8": jnp.int8}
HEAD_DIMS = (64, 128, 256)
HEADS = [(2 * g, 2) for g in range(1, 9)] + [(9, 3)]  # (query heads, KV heads): groups 1-8, SmolLM2's
VARIANTS = {"plain": dict(), "window+softcap": dict(sliding_window=512, soft_cap=30.0)}
PAGES, PAGE_SIZE = 512, 32
# (tokens, sequences, context): a small step, and long context at the TPU's default batch and
# twice it (the page table is max_num_seqs x context / PAGE_SIZE indices: 8 MiB at 512 x 128k).
SHAPES = {"32x1k": (128, 32, 1024), "256x128k": (512, 256, 131072), "512x128k": (512, 512, 131072)}


def compile_cell(mesh, kv_dtype, head_dim, nq, nkv, variant, shape="32x1k") -> tuple[bool, float, str | None]:
    shd = NamedSharding(mesh, P())
    s = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=shd)
    tokens, seqs, context = SHAPES[shape]
    backend = get_backend(EngineConfig(model=ModelConfig(dtype="bfloat16")), get_platform("tpu"))
    cache = backend.kv_cache_shape(1, PAGES, PAGE_SIZE, nkv, head_dim)
    args = (s((tokens, nq, head_dim), jnp.bfloat16), s(cache, kv_dtype), s((), jnp.int32), s((seqs,), jnp.int32),
            s((seqs, context // PAGE_SIZE), jnp.int32), s((seqs + 1,), jnp.int32), s((1,), jnp.int32))
    fn = functools.partial(tpu.ragged_paged_attention, sm_scale=head_dim ** -0.5, kv_layout="tpu", **VARIANTS[variant])
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            jax.jit(fn).lower(*args).compile()
        return True, time.perf_counter() - start, None
    except Exception as e:  # Mosaic's refusal is the finding
        return False, time.perf_counter() - start, str(e).strip().splitlines()[0][:500]


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chips", nargs="+", default=sorted(CHIPS), choices=sorted(CHIPS))
    p.add_argument("--groups", nargs="+", type=int, default=list(range(1, 9)),
                   help="GQA groups of 2 KV heads to compile (SmolLM2's 9 / 3 heads always)")
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES),
                   help="(tokens, sequences, context) of the step")
    p.add_argument("--json", help="write the cells here")
    ns = p.parse_args(argv)
    from jax.experimental import topologies
    rows = []
    for chip in ns.chips:
        device = topologies.get_topology_desc(topology_name=f"{chip}:{CHIPS[chip].host_topology}",
                                              platform="tpu").devices[0]
        mesh = Mesh(np.array([device]), ("x",))
        heads = [(nq, nkv) for nq, nkv in HEADS if nkv == 3 or nq // nkv in ns.groups]
        for (shape, dt, hd, (nq, nkv), variant) in itertools.product(ns.shapes, KV_DTYPES, HEAD_DIMS, heads,
                                                                      VARIANTS):
            ok, secs, error = compile_cell(mesh, KV_DTYPES[dt], hd, nq, nkv, variant, shape)
            tokens, seqs, context = SHAPES[shape]
            rows.append(dict(chip=chip, kv_dtype=dt, head_dim=hd, q_heads=nq, kv_heads=nkv, variant=variant,
                             tokens=tokens, seqs=seqs, context=context, compiled=ok, compile_s=round(secs, 2),
                             error=error))
            if not ok:
                print(f"FAILED {rows[-1]}", flush=True)
        done = [r for r in rows if r["chip"] == chip]
        print(f"{chip}: {sum(r['compiled'] for r in done)}/{len(done)} cells compile "
              f"({sum(r['compile_s'] for r in done):.0f} s)", flush=True)
    print(f"all: {sum(r['compiled'] for r in rows)}/{len(rows)} cells compile")
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(dict(jax=jax.__version__, cells=rows), f, indent=1)
    return rows


if __name__ == "__main__":
    main()
