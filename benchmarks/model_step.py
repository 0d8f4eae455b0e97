"""One decode step of the model with the platform's attention, and where its time goes.

The kernel benchmark (benchmarks/kernels.py) times attention alone; this times the whole
forward the engine compiles per step (the layer loop the platform picks, the KV write and
the attention `auto` picks, then the LM head over the sampled rows) and traces it: wall time
per step against the device's busy time on each timeline. The gap is time the device waits
on the host, e.g. for a conditional's branch index (XLA on GPU copies it to the host and
waits). Weights are zeros: the timing does not depend on their values. `--lower` only lowers
ModelRunner's own step programs for a TPU or GPU (benchmarks/lower_step.py).

    python benchmarks/model_step.py                  # SmolLM2-135M shapes, bf16, 64 x 2k decode
    python benchmarks/model_step.py --smoke          # tiny shapes (any CPU)
    python benchmarks/model_step.py --lower tpu --shape llama3-8b --dump-hlo /tmp/hlo   # no device
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lower_step import KERNEL_TARGETS, REQUESTS, TOKENS, lower_step, program_rows  # noqa: E402
from benchmarks.model_shapes import SHAPES, TINY  # noqa: E402
from benchmarks.trace_summary import format_rows, load_events, summarize, timeline_busy  # noqa: E402
from jaxvllm.layers.attention import AttentionMetadata, get_attention  # noqa: E402
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM  # noqa: E402
from jaxvllm.platforms import current_platform  # noqa: E402


def decode_step_inputs(a: LlamaArgs, seqs: int, context: int, page_size: int, dtype):
    """A decode step of `seqs` sequences at `context` tokens each, pages laid out in order."""
    pages_per_seq = -(-context // page_size)
    kv_cache = jnp.zeros((a.num_layers, 2, 1 + seqs * pages_per_seq, page_size, a.num_kv_heads, a.head_dim), dtype)
    page_indices = 1 + np.arange(seqs * pages_per_seq, dtype=np.int32).reshape(seqs, pages_per_seq)
    pos = context - 1
    slot = page_indices[:, pos // page_size] * page_size + pos % page_size
    md = AttentionMetadata(positions=jnp.full((seqs,), pos, jnp.int32), slot_mapping=jnp.asarray(slot),
                           kv_lens=jnp.full((seqs,), context, jnp.int32), page_indices=jnp.asarray(page_indices),
                           cu_q_lens=jnp.arange(seqs + 1, dtype=jnp.int32), num_seqs=jnp.array([seqs], jnp.int32))
    return jnp.ones((seqs,), jnp.int32), kv_cache, md


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny model and batch (any CPU)")
    ap.add_argument("--seqs", type=int, default=64)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--profile", metavar="DIR", default="/tmp/jaxvllm-model-step-trace")
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
    args, seqs, context, steps = (TINY, 4, 40, 3) if a.smoke else (SHAPES[a.shape], a.seqs, a.context, a.steps)

    dev = jax.devices()[0]
    dtype = jnp.dtype(a.dtype)
    graphdef, params = nnx.split(LlamaForCausalLM(args, dtype=dtype))
    attend = get_attention(a.attention_backend, current_platform)

    def step(params, input_ids, kv_cache, md):
        model = nnx.merge(graphdef, params)
        hidden, kv_cache = model(input_ids, kv_cache, md, attend, current_platform.layer_loop)
        return jnp.argmax(model.compute_logits(hidden), axis=-1), kv_cache

    ids, kv_cache, md = decode_step_inputs(args, seqs, context, a.page_size, dtype)
    # Compiled once and called as compiled: a jit call would compile the same program again.
    step = jax.jit(step, donate_argnums=(2,)).lower(params, ids, kv_cache, md).compile()
    hlo = step.as_text()
    tokens, kv_cache = step(params, ids, kv_cache, md)
    tokens.block_until_ready()
    start = time.perf_counter()
    for _ in range(steps):
        tokens, kv_cache = step(params, ids, kv_cache, md)
    tokens.block_until_ready()
    wall_us = (time.perf_counter() - start) / steps * 1e6

    with jax.profiler.trace(a.profile):
        for _ in range(steps):
            tokens, kv_cache = step(params, ids, kv_cache, md)
        tokens.block_until_ready()
    events = load_events(a.profile)

    print(f"model step: {args.num_layers} layers, hidden {args.hidden_size}, {seqs} seqs x {context} context, "
          f"{dtype.name}, attention {a.attention_backend} on {dev.device_kind} "
          f"({current_platform.device_name}); "
          f"compiled program: {hlo.count(' conditional(')} conditionals, {hlo.count(' while(')} while loops")
    print(f"  wall {wall_us:9.1f} us/step")
    for timeline, busy in timeline_busy(events, steps).items():
        print(f"  busy {busy:9.1f} us/step ({100 * busy / wall_us:5.1f}% of wall)  {timeline}")
    print(format_rows(summarize(events, steps, top=6)), flush=True)


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
