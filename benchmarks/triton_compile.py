"""The GPU attention kernel compiled for an NVIDIA GPU with no GPU attached: jax lowers the
Pallas (Triton) kernel for `cuda` (the custom call carries the kernel as Triton IR), and
Triton's own compiler turns that IR into a cubin for sm_90. jax 0.10.2's CUDA plugin has no
compile-only topology, so this is the deviceless check beyond StableHLO. Cells: KV dtype x head
dim x GQA heads; a compile, not a run.

Triton lives in a venv of its own (`python3.11 -m venv .venv-triton && .venv-triton/bin/pip
install triton==3.9.0`); this script runs in the project's venv and hands the IR to it:

    python benchmarks/triton_compile.py --triton-python .venv-triton/bin/python --json out.json
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
from jax._src.lib import triton as jax_triton
from jax._src.lib.mlir import ir
from jax.export import DisabledSafetyCheck

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pallas_kernels import ragged_paged_attention_gpu as gpu  # noqa: E402

TARGET = "__gpu$xla.gpu.triton"
KV_DTYPES = {"bf16": jnp.bfloat16, "fp8": jnp.float8_e4m3fn, "int8": jnp.int8}
HEAD_DIMS = (64, 128, 256)
HEADS = [(2, 2), (16, 2), (9, 3)]  # GQA groups 1 and 8, SmolLM2's 9 / 3
COMPILE = """
import json, sys, time
import triton
from triton.backends.compiler import GPUTarget
out = []
for path, warps, stages in json.load(open(sys.argv[1])):
    start = time.perf_counter()
    try:
        k = triton.compile(path, target=GPUTarget("cuda", int(sys.argv[2]), 32),
                           options=dict(num_warps=warps, num_stages=stages))
        out.append(dict(compiled=True, shared_bytes=k.metadata.shared, compile_s=time.perf_counter() - start))
    except Exception as e:
        out.append(dict(compiled=False, error=str(e).strip().splitlines()[-1][:500]))
print(json.dumps(out))
"""


def kernel_ir(kv_dtype, head_dim, nq, nkv) -> list[tuple[str, int, int]]:
    """(Triton IR text, num_warps, num_stages) of each Triton call in the kernel's lowering."""
    s = jax.ShapeDtypeStruct
    args = (s((64, nq, head_dim), jnp.bfloat16), s((2, 2, 256, 16, nkv, head_dim), kv_dtype), s((), jnp.int32),
            s((32,), jnp.int32), s((32, 16), jnp.int32), s((33,), jnp.int32), s((1,), jnp.int32))
    fn = functools.partial(gpu.ragged_paged_attention, sm_scale=head_dim ** -0.5)
    text = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[
        DisabledSafetyCheck.custom_call(TARGET)])(*args).mlir_module()
    out = []
    for config in (line for line in text.splitlines() if f"@{TARGET}(" in line):
        escaped = re.search(r'ir = "([^"]*)"', config).group(1)  # MLIR escapes: \\ and \XX
        data = re.sub(rb"\\(\\|[0-9A-Fa-f]{2})", lambda m: b"\\" if m.group(1) == b"\\" else
                      bytes([int(m.group(1), 16)]), escaped.encode("latin1"))
        ctx = ir.Context()
        jax_triton.dialect.register_dialect(ctx)
        with ctx:
            ttir = ir.Module.parse(data).operation.get_asm(enable_debug_info=False)
        warps = int(re.search(r"num_warps = (\d+)", config).group(1))
        stages = int(re.search(r"num_stages = (\d+)", config).group(1))
        out.append((ttir, warps, stages))
    return out


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--triton-python", required=True, help="a Python with triton installed")
    p.add_argument("--sm", type=int, default=90)
    p.add_argument("--json")
    ns = p.parse_args(argv)
    cells, jobs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for dt, hd, (nq, nkv) in itertools.product(KV_DTYPES, HEAD_DIMS, HEADS):
            for i, (ttir, warps, stages) in enumerate(kernel_ir(KV_DTYPES[dt], hd, nq, nkv)):
                path = f"{tmp}/{dt}-{hd}-{nq}-{nkv}-{i}.ttir"
                Path(path).write_text(ttir)
                jobs.append((path, warps, stages))
                cells.append(dict(kv_dtype=dt, head_dim=hd, q_heads=nq, kv_heads=nkv, sm=ns.sm))
        Path(f"{tmp}/jobs.json").write_text(json.dumps(jobs))
        done = subprocess.run([ns.triton_python, "-c", COMPILE, f"{tmp}/jobs.json", str(ns.sm)],
                              capture_output=True, text=True, check=True).stdout
    rows = [dict(c, **r) for c, r in zip(cells, json.loads(done.strip().splitlines()[-1]))]
    for r in rows:
        print(r)
    print(f"sm_{ns.sm}: {sum(r['compiled'] for r in rows)}/{len(rows)} Triton kernels compile")
    if ns.json:
        Path(ns.json).write_text(json.dumps(dict(jax=jax.__version__, cells=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
