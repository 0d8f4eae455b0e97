"""Ragged paged attention: the platform's Pallas kernel against the XLA kernel
(jaxvllm/kernels/xla, the `xla` backend; `reference` in the table and JSON).

Llama-3-8B-like attention (32 query / 8 KV heads, head_dim 128) over decode, prefill and
mixed steps. For each case: kernel and reference time per call, the kernel's achieved
bandwidth (KV bytes it must read + queries + outputs, over its time) against this device's
measured copy bandwidth, its attention TFLOP/s, and its max difference from the reference.
Prints one table and writes a JSON result.

    python benchmarks/kernels.py                     # on a TPU or GPU
    python benchmarks/kernels.py --sweep             # + block-size sweep on two decode cases
    python benchmarks/kernels.py --smoke             # tiny shapes, interpret mode (any CPU)
    python benchmarks/kernels.py --profile DIR       # + a device trace of the first case
"""
from __future__ import annotations

import argparse
import json
import platform as _platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.trace_summary import format_rows, load_events, summarize  # noqa: E402
from jaxvllm.kernels.xla.ragged_paged_attention import ragged_paged_attention as reference  # noqa: E402
from pallas_kernels import ragged_paged_attention_gpu, ragged_paged_attention_tpu  # noqa: E402

NQ, NKV, HD = 32, 8, 128

# name, [(q_len, kv_len)] per sequence, page_size
CASES = [
    ("decode", [(1, 2048)] * 64, 16),
    ("decode", [(1, 2048)] * 64, 64),
    ("decode", [(1, 2048)] * 128, 16),
    ("decode", [(1, 4096)] * 64, 32),
    ("decode", [(1, 2048)] * 256, 16),
    ("decode", [(1, 8192)] * 16, 128),
    ("decode", [(1, 128)] * 1, 16),
    ("prefill", [(2048, 2048)], 16),
    ("prefill", [(512, 512)] * 4, 64),
    ("prefill", [(512, 8192)], 64),  # a late chunk of a long prompt
    ("mixed", [(1, 2048)] * 32 + [(512, 1024)], 16),
    ("mixed", [(1, 4096)] * 128 + [(256, 256)] * 2, 32),
]
# Block sizes `--sweep` tries on the decode cases, per kernel.
SWEEP = {
    "gpu": [dict(block_q=bq, pages_per_block=ppb, num_stages=st, num_splits=sp) for bq in (4, 16)
            for ppb in (4, 8) for st in (3, 4) for sp in (1, 2, 4)],
    "tpu": [dict(block_q=bq, pages_per_block=ppb) for bq in (8, 16, 32) for ppb in (4, 8, 16)],
}
SMOKE = [("decode", [(1, 40)] * 4, 16), ("prefill", [(24, 24)], 16), ("mixed", [(1, 33)] * 3 + [(9, 20)], 16)]


def make_case(rng, seqs, page_size, dtype, nq=NQ, nkv=NKV, hd=HD):
    need = [-(-kv // page_size) for _, kv in seqs]
    pages_per_seq = max(need)
    num_pages = 1 + sum(need)
    perm = 1 + rng.permutation(num_pages - 1)  # scattered pages, page 0 is the null page
    page_indices = np.zeros((len(seqs), pages_per_seq), np.int32)
    used = 0
    for s, n in enumerate(need):
        page_indices[s, :n] = perm[used:used + n]
        used += n
    kv_lens = np.array([kv for _, kv in seqs], np.int32)
    cu_q_lens = np.concatenate([[0], np.cumsum([q for q, _ in seqs])]).astype(np.int32)
    num_tokens = int(cu_q_lens[-1])
    key = jax.random.key(int(rng.integers(1 << 30)))
    kq, kc = jax.random.split(key)
    q = jax.random.normal(kq, (num_tokens, nq, hd), dtype)
    cache = jax.random.normal(kc, (1, 2, num_pages, page_size, nkv, hd), dtype)
    return (q, cache, jnp.int32(0), jnp.asarray(kv_lens), jnp.asarray(page_indices),
            jnp.asarray(cu_q_lens), jnp.array([len(seqs)], jnp.int32))


def case_cost(seqs, dtype, nq=NQ, nkv=NKV, hd=HD):
    """(bytes the kernel must move, attention FLOPs) under causal masking."""
    item = jnp.dtype(dtype).itemsize
    kv_bytes = sum(kv for _, kv in seqs) * 2 * nkv * hd * item
    q_tokens = sum(q for q, _ in seqs)
    qo_bytes = 2 * q_tokens * nq * hd * item
    visible = sum(sum(kv - q + 1 + t for t in range(q)) for q, kv in seqs)
    return kv_bytes + qo_bytes, 4 * visible * nq * hd


def timeit(fn, args, iters):
    out = fn(*args)
    out.block_until_ready()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            out = fn(*args)
        out.block_until_ready()
        best = min(best, (time.perf_counter() - start) / iters)
    return best, out


def copy_bandwidth(nbytes=2 << 30):
    """Bytes read + written per second by a device copy of nbytes (x + 1 over bf16)."""
    x = jnp.ones((nbytes // 2,), jnp.bfloat16)
    f = jax.jit(lambda x: x + 1)
    timeit(f, (x,), 50)  # also brings the device's clocks up before anything is timed
    t, _ = timeit(f, (x,), 10)
    return 2 * nbytes / t


def kernel_for(platform, smoke):
    if smoke or platform not in ("tpu", "gpu", "cuda", "rocm"):
        return "tpu", ragged_paged_attention_tpu.ragged_paged_attention, True
    if platform == "tpu":
        return "tpu", ragged_paged_attention_tpu.ragged_paged_attention, False
    return "gpu", ragged_paged_attention_gpu.ragged_paged_attention, False


def profile(fn, args, case, trace_dir, calls):
    """Trace `calls` calls of one case's jitted kernel `fn(*args)` (compiled already: the case
    was just timed) and print the device time per call by event: the attention kernel against
    the XLA ops around it."""
    kind, seqs, ps = case
    fn(*args).block_until_ready()
    with jax.profiler.trace(trace_dir):
        for _ in range(calls):
            out = fn(*args)
        out.block_until_ready()
    print(f"\nprofile: {kind} {len(seqs)} seqs ctx {max(kv for _, kv in seqs)} ps {ps}, {calls} calls "
          f"(trace in {trace_dir}):")
    print(format_rows(summarize(load_events(trace_dir), calls)), flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in interpret mode (CPU)")
    ap.add_argument("--sweep", action="store_true", help="block-size sweep on decode 64 and 256 x 2k")
    ap.add_argument("--sweep-only", action="store_true", help="only the sweep")
    ap.add_argument("--profile", metavar="DIR", help="trace the first case's kernel calls into DIR "
                    "and print where its device time goes")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default="kernels.json")
    a = ap.parse_args(argv)

    dev = jax.devices()[0]
    dtype = jnp.dtype(a.dtype)
    name, kernel, interpret = kernel_for(dev.platform, a.smoke)
    cases = SMOKE if a.smoke else [] if a.sweep_only else CASES
    iters = 2 if a.smoke else a.iters
    nq, nkv, hd = (8, 2, 64) if a.smoke else (NQ, NKV, HD)
    bw = copy_bandwidth(4 << 20 if a.smoke else 2 << 30)  # smoke: small (bfloat16 copies slowly on a CPU)
    print(f"device: {dev.device_kind} ({dev.platform}), kernel: {name}{' (interpret)' if interpret else ''}, "
          f"dtype {dtype.name}, jax {jax.__version__}, measured copy bandwidth {bw / 1e9:.0f} GB/s", flush=True)

    rng = np.random.default_rng(0)
    rows, sweep = [], []

    def save() -> dict:
        """The figures so far, written after every case: a run cut short by its budget keeps them."""
        result = dict(device=dev.device_kind, platform=dev.platform, kernel=name, interpret=interpret,
                      dtype=dtype.name, jax=jax.__version__, host=_platform.node(), copy_gbps=bw / 1e9,
                      heads=dict(q=nq, kv=nkv, head_dim=hd), cases=rows, sweep=sweep)
        Path(a.out).write_text(json.dumps(result, indent=1))
        return result

    for kind, seqs, ps in cases:
        args = make_case(rng, seqs, ps, dtype, nq, nkv, hd)
        scale = hd ** -0.5
        kfn = jax.jit(lambda *x: kernel(*x, sm_scale=scale, interpret=interpret))  # noqa: B023 (timed at once)
        rfn = jax.jit(lambda *x: reference(*x, sm_scale=scale))  # noqa: B023
        kt, kout = timeit(kfn, args, iters)
        rt, rout = timeit(rfn, args, iters)
        nbytes, flops = case_cost(seqs, dtype, nq, nkv, hd)
        err = float(jnp.max(jnp.abs(kout.astype(jnp.float32) - rout.astype(jnp.float32))))
        ctx = max(kv for _, kv in seqs)
        row = dict(case=kind, seqs=len(seqs), max_context=ctx, q_tokens=int(args[0].shape[0]), page_size=ps,
                   kernel_ms=kt * 1e3, reference_ms=rt * 1e3, speedup=rt / kt, kernel_gbps=nbytes / kt / 1e9,
                   pct_copy_bw=100 * nbytes / kt / bw, kernel_tflops=flops / kt / 1e12, max_abs_err=err)
        rows.append(row)
        save()
        print(f"  {kind:8s} {len(seqs):4d} seqs ctx {ctx:5d} ps {ps:3d}: kernel {kt * 1e3:8.3f} ms, "
              f"reference {rt * 1e3:8.3f} ms, {row['kernel_gbps']:7.0f} GB/s ({row['pct_copy_bw']:5.1f}%), "
              f"err {err:.2e}", flush=True)
        if a.profile and len(rows) == 1:
            profile(kfn, args, (kind, seqs, ps), a.profile, iters)
        del args, kout, rout

    if (a.sweep or a.sweep_only) and not a.smoke:
        opts = SWEEP[name]
        for seqs in ([(1, 2048)] * 64, [(1, 2048)] * 256):
            args = make_case(rng, seqs, 16, dtype)
            nbytes, _ = case_cost(seqs, dtype)
            want = jax.jit(lambda *x: reference(*x, sm_scale=HD ** -0.5))(*args).astype(jnp.float32)
            label = f"decode {len(seqs)}x2k ps16"
            for o in opts:
                try:
                    t, out = timeit(jax.jit(lambda *x, o=o: kernel(*x, sm_scale=HD ** -0.5, **o)), args, a.iters)
                    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - want)))
                    sweep.append(dict(o, case=label, ms=t * 1e3, pct_copy_bw=100 * nbytes / t / bw, max_abs_err=err))
                    print(f"  sweep {label} {o}: {t * 1e3:.3f} ms ({100 * nbytes / t / bw:.1f}% of copy BW), "
                          f"err {err:.1e}", flush=True)
                except Exception as e:  # a configuration the compiler rejects is a result too
                    sweep.append(dict(o, case=label, error=repr(e)[:300]))
                    print(f"  sweep {label} {o}: failed: {repr(e)[:200]}", flush=True)
            del args, want

    if a.profile and not cases:  # --sweep-only: the first case, for its trace alone
        kind, seqs, ps = CASES[0]
        profile(jax.jit(lambda *x: kernel(*x, sm_scale=HD ** -0.5, interpret=interpret)),
                make_case(rng, seqs, ps, dtype), CASES[0], a.profile, iters)

    save()

    print(f"\nragged paged attention, {dev.device_kind}, {dtype.name}, copy bandwidth {bw / 1e9:.0f} GB/s")
    print(f"{'case':8s} {'seqs':>4s} {'ctx':>5s} {'q tok':>5s} {'ps':>3s} {'kernel ms':>9s} {'ref ms':>8s} "
          f"{'x ref':>6s} {'GB/s':>6s} {'%copy':>6s} {'TFLOP/s':>7s} {'max err':>8s}")
    for r in rows:
        print(f"{r['case']:8s} {r['seqs']:4d} {r['max_context']:5d} {r['q_tokens']:5d} {r['page_size']:3d} "
              f"{r['kernel_ms']:9.3f} {r['reference_ms']:8.3f} {r['speedup']:6.1f} {r['kernel_gbps']:6.0f} "
              f"{r['pct_copy_bw']:6.1f} {r['kernel_tflops']:7.1f} {r['max_abs_err']:8.1e}")
    print(f"JSON: {a.out}")


if __name__ == "__main__":
    main()
