"""Latency of the offline engine: time to first token (TTFT) and time per output token
(TPOT) at fixed batch sizes, and start-up to first token with cold and warm caches.

A batch is submitted at once and stepped to completion; each request's TTFT is from
submission to its first token, its TPOT the mean gap between its later tokens. Every
iteration draws fresh prompts (and the prefix cache is reset) so no prefill is skipped.
Start-up runs this script again as a fresh process (`--startup-child`) that builds `LLM`
and generates one token, first with JAXVLLM_XLA_CACHE and JAXVLLM_MODEL_CACHE pointing to
new empty directories (cold: every bucket compiles, a GGUF is parsed and dequantized) and
then with the same directories (warm: programs and the converted model load).

    python benchmarks/latency.py                                  # default model, batch 1 and 8
    python benchmarks/latency.py --batch-sizes 1 4 16 --input-len 256 --output-len 32 --json r.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.workload import make_workload  # noqa: E402


@dataclass
class BatchLatency:
    batch_size: int
    ttft_s: float       # median over iterations of the batch's mean TTFT
    tpot_s: float       # median over iterations of the batch's mean TPOT
    e2e_s: float        # median wall time of the whole batch
    output_tok_s: float  # batch output tokens over e2e


@dataclass
class Startup:
    cold_s: float       # process start to first token, empty XLA and model caches
    warm_s: float       # the same with the caches the cold run filled
    speedup: float      # cold_s / warm_s
    cold_child: dict    # the child's own breakdown (LLM construction, generate, compilations)
    warm_child: dict


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model path (default: SmolLM2-135M-Instruct GGUF)")
    p.add_argument("--config", default=None, help="YAML preset of engine arguments")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=64, help="output tokens per request (ignore_eos)")
    p.add_argument("--num-iters", type=int, default=3, help="measured iterations per batch size")
    p.add_argument("--num-iters-warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-startup", action="store_true", help="skip the cold/warm start-up runs")
    p.add_argument("--skip-latency", action="store_true", help="only the cold/warm start-up runs")
    p.add_argument("--json", default=None, help="write the figures to this path")
    p.add_argument("--cache-dir", default=None,
                   help="an empty directory for the start-up runs' XLA and model caches, kept afterwards "
                        "(default: a temporary one); a later run with JAXVLLM_XLA_CACHE=DIR/xla starts warm")
    p.add_argument("--startup-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("input_len", "output_len", "num_iters"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}.")
    if min(args.batch_sizes) < 1:
        raise ValueError(f"--batch-sizes must all be at least 1, got {args.batch_sizes}.")
    return args


def engine_kwargs(args) -> dict:
    kw = {"config": args.config, "max_num_seqs": args.max_num_seqs, "max_model_len": args.max_model_len,
          "max_num_batched_tokens": args.max_num_batched_tokens}
    return {k: v for k, v in kw.items() if v is not None}


def fit_vocab(prompts: list[list[int]], llm) -> list[list[int]]:
    """Token ids modulo the model's vocabulary: a no-op for real models, needed for tiny test
    models that share the default tokenizer but have fewer embeddings."""
    vocab = llm.llm_engine.processor.vocab_size
    return [[t % vocab for t in p] for p in prompts]


def run_batch(llm, prompts: list[list[int]], output_len: int, tag: str) -> tuple[list, list, float]:
    """Submit all prompts at once, step to completion; per-request TTFTs, TPOTs and the wall time."""
    from jaxvllm.sampling_params import RequestOutputKind, SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    start = time.perf_counter()
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    counts = dict.fromkeys(ids, 0)
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            n = len(out.outputs[0].token_ids)
            if n:
                first.setdefault(out.request_id, now)
                last[out.request_id] = now
                counts[out.request_id] += n
    e2e = time.perf_counter() - start
    ttfts = [first[r] - start for r in ids]
    tpots = [(last[r] - first[r]) / (counts[r] - 1) for r in ids if counts[r] > 1]
    return ttfts, tpots, e2e


def measure_latency(args) -> tuple[list[BatchLatency], int]:
    """Per batch size: warm-up iterations, then medians over measured ones; plus the
    number of compilations that happened after the engine's own warm-up."""
    from jaxvllm import LLM

    llm = LLM(args.model, **engine_kwargs(args))
    max_num_seqs = llm.llm_engine.config.scheduler.max_num_seqs
    if max(args.batch_sizes) > max_num_seqs:
        raise ValueError(f"--batch-sizes go up to {max(args.batch_sizes)} but the engine runs at most "
                         f"max_num_seqs={max_num_seqs} at once; raise --max-num-seqs.")
    compiles_at_start = llm.llm_engine.get_stats().num_compilations
    num_runs = args.num_iters_warmup + args.num_iters
    results = []
    for bs in args.batch_sizes:
        # Fresh prompts for every run, so that no prefill is served from the prefix cache.
        workload = make_workload(llm.get_tokenizer(), bs * num_runs, (args.input_len,) * 2,
                                 (args.output_len,) * 2, args.seed + bs)
        prompts = fit_vocab(workload.prompts, llm)
        ttft, tpot, e2e = [], [], []
        for it in range(num_runs):
            llm.reset_prefix_cache()
            t, p, e = run_batch(llm, prompts[it * bs:(it + 1) * bs], args.output_len, f"b{bs}-{it}")
            if it >= args.num_iters_warmup:
                ttft.append(statistics.mean(t))
                tpot.append(statistics.mean(p) if p else float("nan"))
                e2e.append(e)
        e2e_s = statistics.median(e2e)
        results.append(BatchLatency(bs, statistics.median(ttft), statistics.median(tpot), e2e_s,
                                    bs * args.output_len / e2e_s))
    compiles = llm.llm_engine.get_stats().num_compilations - compiles_at_start
    llm.llm_engine.shutdown()
    return results, compiles


def startup_child(args) -> None:
    """Build LLM and generate one token; print when the token arrived (wall clock)."""
    t0 = time.perf_counter()
    from jaxvllm import LLM
    from jaxvllm.sampling_params import SamplingParams

    t_import = time.perf_counter()
    llm = LLM(args.model, **engine_kwargs(args))
    t_init = time.perf_counter()
    prompt = fit_vocab([llm.get_tokenizer().encode("Hello, world")], llm)[0]
    llm.generate({"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=1),
                 use_tqdm=False)
    first_token_unix = time.time()
    t_gen = time.perf_counter()
    print(json.dumps({"first_token_unix": first_token_unix, "import_s": t_import - t0,
                      "llm_init_s": t_init - t_import, "generate_s": t_gen - t_init,
                      "num_compilations": llm.llm_engine.get_stats().num_compilations}))


def run_startup_child(args, cache_dir: str) -> tuple[float, dict]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--startup-child"]
    for flag in ("model", "config", "max_num_seqs", "max_model_len", "max_num_batched_tokens"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--batch-sizes", *map(str, args.batch_sizes)]
    env = dict(os.environ, JAXVLLM_XLA_CACHE=os.path.join(cache_dir, "xla"),
               JAXVLLM_MODEL_CACHE=os.path.join(cache_dir, "models"))
    started = time.time()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"start-up child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    return child.pop("first_token_unix") - started, child


def measure_startup(args, cache_dir: str | None = None) -> Startup:
    """cache_dir: an empty directory to hold the XLA and model caches (default: a temporary one)."""
    if cache_dir is None:
        with tempfile.TemporaryDirectory(prefix="jaxvllm-startup-") as tmp:
            return measure_startup(args, tmp)
    if any(Path(cache_dir).iterdir()):
        raise ValueError(f"cache_dir {cache_dir} must be empty for a cold start.")
    cold, cold_child = run_startup_child(args, cache_dir)
    warm, warm_child = run_startup_child(args, cache_dir)
    return Startup(cold, warm, cold / warm, cold_child, warm_child)


def print_table(args, latencies: list[BatchLatency], startup: Startup | None) -> None:
    if latencies:
        print(f"\nLatency: {args.input_len} prompt tokens, {args.output_len} output tokens, "
              f"median of {args.num_iters} iterations")
        print(f"{'batch':>5}  {'TTFT ms':>9}  {'TPOT ms':>9}  {'e2e s':>7}  {'out tok/s':>9}")
        for r in latencies:
            print(f"{r.batch_size:>5}  {r.ttft_s * 1e3:>9.1f}  {r.tpot_s * 1e3:>9.1f}  {r.e2e_s:>7.2f}  "
                  f"{r.output_tok_s:>9.1f}")
    if startup:
        print("\nStart-up to first token (fresh process)")
        for name, secs, child in (("cold (empty caches)", startup.cold_s, startup.cold_child),
                                  ("warm (same caches)", startup.warm_s, startup.warm_child)):
            print(f"  {name:<24} {secs:7.2f} s  (LLM() {child['llm_init_s']:.2f} s, "
                  f"imports {child['import_s']:.2f} s)")
        print(f"  warm restart is {startup.speedup:.2f}x faster than cold start (goal: >= 5x)")


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.startup_child:
        startup_child(args)
        return {}
    # Other processes on the cores slow every figure several-fold: record how busy they were.
    load_before = os.getloadavg()[0]
    # Start-up first, while this process holds no model and no cores.
    if args.cache_dir:
        Path(args.cache_dir).mkdir(parents=True, exist_ok=True)
    startup = None if args.skip_startup else measure_startup(args, args.cache_dir)
    latencies, compiles = ([], None) if args.skip_latency else measure_latency(args)
    print_table(args, latencies, startup)
    if compiles is not None:
        print(f"\nCompilations after warm-up: {compiles}")
    print(f"Load average (1 min) before the run: {load_before:.2f} on {os.cpu_count()} CPUs")
    result = {"workload": {"input_len": args.input_len, "output_len": args.output_len,
                           "batch_sizes": args.batch_sizes, "num_iters": args.num_iters,
                           "seed": args.seed, "model": args.model or "default"},
              "latency": [asdict(r) for r in latencies],
              "compiles_after_warmup": compiles,
              "startup": asdict(startup) if startup else None,
              "load_avg_1m_before": load_before, "cpu_count": os.cpu_count()}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
