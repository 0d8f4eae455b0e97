"""Host memory (RSS) of the engine-core process across sleep/wake-up cycles on a CPU host:
on the CPU the "device" is host memory, so sleep must give it back to the OS, and cycles
must not pile up. Prints RSS awake and asleep per cycle and the last awake RSS against the
first (the issue's bound: within 10%).

    python benchmarks/sleep_rss.py [--model PATH] [--cycles 20] [--level 1] [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--skip-warmup", action="store_true")
    parser.add_argument("--json", default=None)
    ns = parser.parse_args(argv)
    from jaxvllm import LLM, SamplingParams

    llm = LLM(ns.model, max_model_len=ns.max_model_len, max_num_seqs=4, skip_warmup=ns.skip_warmup,
              kv_cache_memory_bytes=ns.kv_cache_memory_bytes)
    # The engine core runs in this process (LLM's default) or in its own.
    pid = getattr(llm.llm_engine.engine_core_client, "engine_core_pid", None) or os.getpid()
    greedy = SamplingParams(temperature=0, max_tokens=8)
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}]
    before = llm.generate(prompts, greedy, use_tqdm=False)[0].outputs[0].token_ids
    rows = []
    for cycle in range(ns.cycles):
        awake = rss_mib(pid)
        llm.sleep(level=ns.level)
        asleep = rss_mib(pid)
        llm.wake_up()
        same = llm.generate(prompts, greedy, use_tqdm=False)[0].outputs[0].token_ids == before
        rows.append({"cycle": cycle + 1, "awake_mib": round(awake, 1), "asleep_mib": round(asleep, 1),
                     "same_output": same})
        print(f"cycle {cycle + 1:2d}: awake {awake:8.1f} MiB  asleep {asleep:8.1f} MiB  same output {same}",
              flush=True)
    final = rss_mib(pid)
    r = {"cycles": rows, "awake_after_mib": round(final, 1),
         "growth_vs_first": round(final / rows[0]["awake_mib"] - 1, 4)}
    print(f"awake after {ns.cycles} cycles: {final:.1f} MiB ({r['growth_vs_first']:+.1%} vs the first)")
    if ns.json:
        Path(ns.json).write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    main()
