"""Host scheduler cost: schedule() + update_from_output() per step, with a fake model.

No device, no model: the fake model samples one fixed token for every request whose
scheduled tokens reach its end, so only the host core (scheduler, KV cache manager, block
pool) is timed. Cases: 64 / 256 / 1024 running decode requests, and a mixed step (256
decodes plus 512-token prompts arriving and prefilling in chunks). Each case runs with
prefix caching on (the engine default) and off, the peer measured in the same run.
Goal: under 1 ms per step for 256 running requests.

    python benchmarks/scheduler.py [--steps 200] [--out scheduler.json]
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.config import CacheConfig, SchedulerConfig  # noqa: E402
from jaxvllm.core.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheSpec  # noqa: E402
from jaxvllm.core.request import Request  # noqa: E402
from jaxvllm.core.scheduler import Scheduler  # noqa: E402
from jaxvllm.outputs import ModelRunnerOutput  # noqa: E402
from jaxvllm.sampling_params import SamplingParams  # noqa: E402

BLOCK, PROMPT, LONG_PROMPT = 16, 128, 512
PARAMS = SamplingParams(max_tokens=100_000, ignore_eos=True)


def fake_model(sched: Scheduler, so) -> ModelRunnerOutput:
    """Sample token 1 for each request whose scheduled tokens reach its last token."""
    req_ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        req = sched.requests[rid]
        sampled.append([1] if req.num_computed_tokens >= req.num_tokens else [])
    return ModelRunnerOutput(req_ids, sampled)


def make_request(i: int, prompt_len: int) -> Request:
    # Distinct first token per request: no accidental prefix sharing between them.
    return Request(f"r{i}", [i % 50_000 + 2] + [7] * (prompt_len - 1), PARAMS, None, 0,
                   arrival_time=float(i))


def run_case(num_decodes: int, mixed: bool, caching: bool, steps: int) -> dict:
    budget = max(2048, 2 * num_decodes)
    blocks_per_req = -(-(LONG_PROMPT + steps + 8) // BLOCK)
    num_long = steps // 4 + 1 if mixed else 0
    num_blocks = (num_decodes + num_long + 1) * blocks_per_req + 1
    sched = Scheduler(SchedulerConfig(max_num_seqs=num_decodes + (num_long if mixed else 0),
                                      max_num_batched_tokens=budget, max_model_len=4096),
                      CacheConfig(block_size=BLOCK, enable_prefix_caching=caching),
                      KVCacheConfig(num_blocks, [KVCacheGroupSpec(["layers.0.self_attn"], KVCacheSpec(BLOCK, 1))]))
    for i in range(num_decodes):
        sched.add_request(make_request(i, PROMPT))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running) or sched.waiting:
        so = sched.schedule()  # prefill everyone first: not timed
        sched.update_from_output(so, fake_model(sched, so))
    next_id, total, tokens = num_decodes, 0.0, 0
    for step in range(steps):
        if mixed and step % 4 == 0:  # a 512-token prompt every 4 steps, prefilled in chunks
            sched.add_request(make_request(next_id, LONG_PROMPT))
            next_id += 1
        t0 = time.perf_counter()
        so = sched.schedule()
        t1 = time.perf_counter()
        out = fake_model(sched, so)
        t2 = time.perf_counter()
        sched.update_from_output(so, out)
        total += (t1 - t0) + (time.perf_counter() - t2)
        tokens += so.total_num_scheduled_tokens
    us_step = total / steps * 1e6
    return dict(case="mixed" if mixed else "decode", running=num_decodes, prefix_caching=caching,
                us_per_step=us_step, us_per_request=us_step / len(sched.running),
                tokens_per_step=tokens / steps, preemptions=sched.num_preemptions)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported")
    ap.add_argument("--out", default="scheduler.json")
    a = ap.parse_args()
    rows = []
    for n, mixed in [(64, False), (256, False), (1024, False), (256, True)]:
        for caching in (True, False):
            runs = sorted((run_case(n, mixed, caching, a.steps) for _ in range(a.repeats)),
                          key=lambda r: r["us_per_step"])
            rows.append(runs[len(runs) // 2])
    print(f"{'case':<8}{'running':>8}{'caching':>9}{'tokens/step':>13}{'us/step':>10}{'us/request':>12}")
    for r in rows:
        print(f"{r['case']:<8}{r['running']:>8}{'on' if r['prefix_caching'] else 'off':>9}"
              f"{r['tokens_per_step']:>13.0f}{r['us_per_step']:>10.0f}{r['us_per_request']:>12.2f}")
    result = dict(benchmark="scheduler", python=platform.python_version(), machine=platform.machine(),
                  steps=a.steps, rows=rows)
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
