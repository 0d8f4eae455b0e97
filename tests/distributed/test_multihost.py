"""Two local processes as two hosts: jax.distributed with gloo CPU collectives, 4 simulated
devices each, one 8-device mesh (TP=8). Process 0 schedules and broadcasts each
SchedulerOutput over ZMQ; process 1 replays it. Greedy tokens equal a single-process run."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from jaxvllm import LLM, SamplingParams

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41]]
N = 8


def _free_port_pair() -> int:
    """A port p with p + 1 also free (the coordinator and the schedule broadcast)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@pytest.mark.slow
def test_two_processes_one_mesh_match_single_process(tiny_model_dir):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    port = _free_port_pair()
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_check.py"), str(rank), str(port),
                               str(tiny_model_dir), json.dumps(PROMPTS), str(N)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in (0, 1)]
    try:
        results = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, results):
        assert p.returncode == 0, err[-4000:]
    r = json.loads(results[0][0].strip().splitlines()[-1])
    assert (r["process_count"], r["global_devices"], r["local_devices"], r["kv_cache_devices"]) == (2, 8, 4, 8)

    llm = LLM(str(tiny_model_dir), skip_warmup=True, max_num_seqs=8, max_num_batched_tokens=128,
              max_model_len=256, num_gpu_blocks_override=64)
    single = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                          SamplingParams(temperature=0, max_tokens=N, min_tokens=N), use_tqdm=False)
    assert r["tokens"] == [o.outputs[0].token_ids for o in single]
