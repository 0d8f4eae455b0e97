"""The engine's forward step on the device, case by case, against the machine's own limits.

The kernel benchmark (benchmarks/kernels.py) times attention alone; this times the whole
forward the engine compiles per step (the layer loop the platform picks, the KV write and
the attention `auto` picks, then the LM head over the rows that sample) with random weights
(benchmarks/random_weights.py: a GPU runs faster on zeros) and reports, per case:
- decode (64 x 2k and 256 x 1k context by default): the step against its HBM roofline, the
  bytes a step must read (every weight the step multiplies + the KV cache it attends over)
  divided by the copy bandwidth measured in the same run;
- prefill (one 2048-token prompt): model FLOP utilisation against the fastest matmul measured
  in the same run (benchmarks/machine.py: bf16 on an accelerator);
- every case: wall time per step against the device's busy time in a trace of the same steps
  (benchmarks/trace_summary.py). The gap is time the device waits on the host, e.g. for a
  conditional's branch index (XLA on GPU copies it to the host and waits).
Start-up to first token is the engine's, measured by benchmarks/latency.py (cold and warm).
`--lower` only lowers ModelRunner's own step programs for a TPU or GPU (benchmarks/lower_step.py).

    python benchmarks/model_step.py --shape llama3-8b    # on a GPU/TPU: the device check's cases
    python benchmarks/model_step.py --smoke              # tiny shapes (any CPU)
    python benchmarks/model_step.py --lower tpu --shape llama3-8b --dump-hlo /tmp/hlo   # no device
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.kernels import copy_bandwidth  # noqa: E402
from benchmarks.lower_step import KERNEL_TARGETS, REQUESTS, TOKENS, lower_step, program_rows  # noqa: E402
from benchmarks.machine import args_flops_per_token, engine_backend, peak_matmul  # noqa: E402
from benchmarks.model_shapes import SHAPES, TINY  # noqa: E402
from benchmarks.random_weights import random_params  # noqa: E402
from benchmarks.trace_summary import format_rows, load_events, summarize, timeline_busy_union  # noqa: E402
from jaxvllm.layers.attention import AttentionMetadata, get_attention  # noqa: E402
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM  # noqa: E402
from jaxvllm.platforms import current_platform  # noqa: E402

CASES = "decode:64x2048,decode:256x1024,prefill:1x2048"
SMOKE_CASES = "decode:4x40,decode:8x24,prefill:1x32"


def parse_cases(spec: str) -> list[tuple[str, int, int]]:
    """"decode:64x2048,prefill:1x2048" -> [(kind, seqs, context)]; a prefill case's prompt
    is its whole context, a decode case adds one token to it."""
    cases = []
    for item in spec.split(","):
        kind, _, shape = item.partition(":")
        seqs, _, context = shape.partition("x")
        if kind not in ("decode", "prefill") or not seqs.isdigit() or not context.isdigit():
            raise ValueError(f"a case is decode:SEQSxCONTEXT or prefill:SEQSxLEN, got {item!r}")
        cases.append((kind, int(seqs), int(context)))
    return cases


def step_inputs(a: LlamaArgs, seqs: int, q_len: int, context: int, page_size: int, dtype, key):
    """`seqs` sequences each adding `q_len` tokens to reach `context`, pages laid out in
    order, the KV cache random (what a step reads should not be zeros either)."""
    pages_per_seq = -(-context // page_size)
    shape = (a.num_layers, 2, 1 + seqs * pages_per_seq, page_size, a.num_kv_heads, a.head_dim)
    kv_cache = jax.jit(lambda k: jax.random.normal(k, shape, dtype), out_shardings=None)(key)
    page_indices = 1 + np.arange(seqs * pages_per_seq, dtype=np.int32).reshape(seqs, pages_per_seq)
    pos = np.arange(context - q_len, context, dtype=np.int32)
    slot = (page_indices[:, pos // page_size] * page_size + pos % page_size).reshape(-1)
    cu_q_lens = np.arange(seqs + 1, dtype=np.int32) * q_len
    md = AttentionMetadata(positions=jnp.asarray(np.tile(pos, seqs)), slot_mapping=jnp.asarray(slot),
                           kv_lens=jnp.full((seqs,), context, jnp.int32), page_indices=jnp.asarray(page_indices),
                           cu_q_lens=jnp.asarray(cu_q_lens), num_seqs=jnp.array([seqs], jnp.int32))
    ids = jax.random.randint(key, (seqs * q_len,), 3, a.vocab_size, jnp.int32)
    return ids, kv_cache, md, jnp.asarray(cu_q_lens[1:] - 1)


def step_cost(a: LlamaArgs, kind: str, seqs: int, context: int, itemsize: int) -> dict:
    """What one step must do: the bytes it must read (weights it multiplies, KV it attends
    over) and its FLOPs (matmuls and attention under the causal mask, LM head for the rows
    that sample)."""
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    layer_params = a.hidden_size * (q + 2 * kv) + q * a.hidden_size + 3 * a.hidden_size * a.intermediate_size
    weight_bytes = (a.num_layers * layer_params + a.vocab_size * a.hidden_size) * itemsize  # + the head
    kv_bytes = seqs * context * 2 * kv * a.num_layers * itemsize
    shapes = (a.num_layers, a.hidden_size, a.intermediate_size, q, kv, a.vocab_size)
    if kind == "decode":
        flops = seqs * args_flops_per_token(*shapes, context)
    else:  # token t of a prompt attends over t + 1 positions; only its last token samples
        body = args_flops_per_token(*shapes, 0, lm_head=False)
        attention = 4 * a.num_layers * q * context * (context + 1) / 2
        flops = seqs * (context * body + attention + 2 * a.vocab_size * a.hidden_size)
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model and cases (any CPU)")
    ap.add_argument("--cases", default=None, help=f"comma-separated (default {CASES})")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default=None, choices=["bfloat16", "float32"],
                    help="default: the platform's (bfloat16 on an accelerator, float32 on a CPU)")
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", metavar="DIR", default="/tmp/jaxvllm-model-step-trace",
                    help="one trace per case under DIR")
    ap.add_argument("--json", metavar="PATH", help="write every figure here")
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES), help="model shapes")
    ap.add_argument("--lower", choices=sorted(KERNEL_TARGETS),
                    help="only lower the engine's step for this platform (no device needed) and count "
                         "its conditionals, loops and attention kernel calls")
    ap.add_argument("--dump-hlo", metavar="DIR", help="with --lower: write each program's StableHLO here")
    ap.add_argument("--tensor-parallel-size", type=int, default=1,
                    help="with --lower: over this many of this machine's devices (on a CPU, set "
                         "XLA_FLAGS=--xla_force_host_platform_device_count=N)")
    a = ap.parse_args(argv)
    if a.lower:
        return lower(a.lower, a.shape, a.dump_hlo, a.tensor_parallel_size)
    args, name = (TINY, "tiny") if a.smoke else (SHAPES[a.shape], a.shape)
    cases = parse_cases(a.cases or (SMOKE_CASES if a.smoke else CASES))
    steps = 3 if a.smoke else a.steps
    dev = jax.devices()[0]
    on_cpu = dev.platform == "cpu"
    dtype = jnp.dtype(a.dtype or current_platform.default_dtype)

    # The machine's limits, measured first (and with the device's clocks up).
    bandwidth = copy_bandwidth(4 << 20 if a.smoke else 256 << 20 if on_cpu else 2 << 30)
    peak = peak_matmul(dtype, 512 if a.smoke else 2048 if on_cpu else 8192)

    abstract = nnx.eval_shape(lambda: LlamaForCausalLM(args, dtype=dtype))
    graphdef, params = nnx.split(abstract)
    nnx.replace_by_pure_dict(params, random_params(args, dtype))
    backend = engine_backend(a.attention_backend, dtype)
    attend = get_attention(backend.attention_impl, current_platform.kv_cache_layout)  # pages in the model's dtype

    def step(params, input_ids, kv_cache, md, logits_indices):
        model = nnx.merge(graphdef, params)
        hidden, kv_cache = model(input_ids, kv_cache, md, attend, backend.layer_loop)
        return jnp.argmax(model.compute_logits(hidden[logits_indices]), axis=-1), kv_cache

    print(f"model step: {name}, {args.num_layers} layers, hidden {args.hidden_size}, {dtype.name}, "
          f"attention {a.attention_backend} on {dev.device_kind} ({current_platform.device_name}), "
          f"jax {jax.__version__}", flush=True)
    print(f"  limits measured: copy {bandwidth / 1e9:.1f} GB/s; matmul {peak['flops'] / 1e12:.2f} TFLOP/s "
          f"({peak['source']}, the fastest of "
          + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in peak["measured"].items()) + ")", flush=True)
    rows = []
    for i, (kind, seqs, context) in enumerate(cases):
        rows.append(run_case(step, params, args, kind, seqs, context, a.page_size, dtype, steps,
                             f"{a.profile}/{kind}-{seqs}x{context}", bandwidth, peak["flops"], i))
    result = dict(shape=name, device=dev.device_kind, platform=current_platform.device_name, dtype=dtype.name,
                  jax=jax.__version__, copy_gbps=bandwidth / 1e9, matmul_tflops=peak["flops"] / 1e12,
                  matmul_source=peak["source"], cases=rows)
    print_table(result)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    return result


def run_case(step, params, args, kind, seqs, context, page_size, dtype, steps, trace_dir, bandwidth,
             peak_flops, seed) -> dict:
    """Compile the step for one case, time it, trace it; its figures against the limits."""
    q_len = 1 if kind == "decode" else context
    ids, kv_cache, md, rows = step_inputs(args, seqs, q_len, context, page_size, dtype, jax.random.key(seed))
    # Compiled once and called as compiled: a jit call would compile the same program again.
    start = time.perf_counter()
    compiled = jax.jit(step, donate_argnums=(2,)).lower(params, ids, kv_cache, md, rows).compile()
    compile_s = time.perf_counter() - start
    hlo = compiled.as_text()
    tokens, kv_cache = compiled(params, ids, kv_cache, md, rows)
    tokens.block_until_ready()
    start = time.perf_counter()
    for _ in range(steps):
        tokens, kv_cache = compiled(params, ids, kv_cache, md, rows)
    tokens.block_until_ready()
    wall_us = (time.perf_counter() - start) / steps * 1e6
    with jax.profiler.trace(trace_dir):
        for _ in range(steps):
            tokens, kv_cache = compiled(params, ids, kv_cache, md, rows)
        tokens.block_until_ready()
    del kv_cache  # before the next case allocates its own
    events = load_events(trace_dir)
    # The busiest device timeline (a GPU's compute stream, a TPU core's ops), its events'
    # union: time it spent waiting on the host is the rest of the wall time.
    busy = timeline_busy_union(events, steps)
    busy_us = max(busy.values(), default=0.0)
    cost = step_cost(args, kind, seqs, context, dtype.itemsize)
    roofline_us = (cost["weight_bytes"] + cost["kv_bytes"]) / bandwidth * 1e6
    row = dict(case=f"{kind} {seqs} x {context}", kind=kind, seqs=seqs, context=context, wall_us=wall_us,
               busy_us=busy_us, busy_pct=100 * busy_us / wall_us, compile_s=compile_s,
               conditionals=hlo.count(" conditional("), while_loops=hlo.count(" while("),
               tok_s=seqs * q_len / wall_us * 1e6, **cost, roofline_us=roofline_us,
               pct_roofline=100 * roofline_us / wall_us, mfu_pct=100 * cost["flops"] / (wall_us / 1e6) / peak_flops)
    print(f"\n{row['case']}: wall {wall_us:9.1f} us/step, device busy {busy_us:9.1f} us/step "
          f"({row['busy_pct']:5.1f}% of wall), compiled in {compile_s:.1f} s, "
          f"{row['conditionals']} conditionals, {row['while_loops']} while loops", flush=True)
    if kind == "decode":
        print(f"  reads {cost['weight_bytes'] / 1e9:.3g} GB weights + {cost['kv_bytes'] / 1e9:.3g} GB KV: "
              f"HBM roofline {roofline_us:.1f} us, the step at {row['pct_roofline']:.1f}% of it; "
              f"{row['tok_s']:.0f} tok/s")
    else:
        print(f"  {cost['flops'] / 1e12:.3g} TFLOP: {cost['flops'] / wall_us / 1e6:.3g} TFLOP/s, "
              f"MFU {row['mfu_pct']:.1f}%; {row['tok_s']:.0f} tok/s")
    for timeline, us in busy.items():
        print(f"  busy {us:9.1f} us/step ({100 * us / wall_us:5.1f}% of wall)  {timeline}")
    print(format_rows(summarize(events, steps, top=6)), flush=True)
    return row


def print_table(result: dict) -> None:
    print(f"\nmodel step table: {result['shape']}, {result['dtype']}, {result['device']}, "
          f"copy {result['copy_gbps']:.1f} GB/s, matmul {result['matmul_tflops']:.2f} TFLOP/s "
          f"({result['matmul_source']})")
    print(f"  {'case':<22}{'wall us':>10}{'busy %':>8}{'roofline %':>11}{'MFU %':>7}{'tok/s':>10}")
    for r in result["cases"]:
        roof = f"{r['pct_roofline']:.1f}" if r["kind"] == "decode" else "-"
        print(f"  {r['case']:<22}{r['wall_us']:>10.1f}{r['busy_pct']:>8.1f}{roof:>11}{r['mfu_pct']:>7.1f}"
              f"{r['tok_s']:>10.0f}")


def lower(platform: str, shape: str, dump_dir: str | None, tensor_parallel_size: int = 1) -> list[dict]:
    """Lower the step (benchmarks/lower_step.py), print one row per program, dump its StableHLO."""
    texts, kv_cache = lower_step(platform, SHAPES[shape], tensor_parallel_size)
    rows = program_rows(platform, texts, kv_cache)
    print(f"{shape} lowered for {platform} ({TOKENS} tokens, {REQUESTS} requests, "
          f"tensor parallel {tensor_parallel_size}):")
    print(f"  {'program':<52} {'case':>5} {'while':>6} {'kernels':>8} {'KV donated':>11}")
    for r in rows:
        donated = "" if r["kv_donated"] is None else str(r["kv_donated"])
        print(f"  {r['program']:<52} {r['case']:>5} {r['loops']:>6} {r['kernels']:>8} {donated:>11}")
    if dump_dir:
        Path(dump_dir).mkdir(parents=True, exist_ok=True)
        for name, text in texts.items():
            (Path(dump_dir) / f"{platform}-{shape}-{name.replace(' ', '-')}.mlir").write_text(text)
    return rows


if __name__ == "__main__":
    main()
