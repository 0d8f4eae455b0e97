"""The hybrid KV cache on Gemma 3 270M (15 sliding layers at window 512, 3 global), before
(disable_hybrid_kv_cache_manager: every layer keeps every page) and after, in one run:

1. capacity: requests of --capacity-len tokens that the pool holds with the same KV memory
   (--kv-memory), as the engine sizes it from the worker's specs;
2. speed: decode step time at --context tokens of context, the two engines' steps
   alternated in rounds. The context's K/V are the pool's zeros: a step's time does not
   depend on their values, and no 8k-token prefill has to run first.

    python benchmarks/hybrid_kv_cache.py --gguf ~/.cache/jaxvllm/test-models/gemma-3-270m-q4_k_m.gguf
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

from jaxvllm import LLM, SamplingParams
from jaxvllm.core.kv_cache_interface import blocks_per_request, describe_groups, get_kv_cache_config
from jaxvllm.core.sched_output import CachedRequestData, NewRequestData, SchedulerOutput

GGUF = Path.home() / ".cache" / "jaxvllm" / "test-models" / "gemma-3-270m-q4_k_m.gguf"


def capacity(specs: dict, kv_memory: int, max_model_len: int) -> dict:
    config = get_kv_cache_config(specs, kv_memory, max_model_len=max_model_len)
    per_request = blocks_per_request(config.kv_cache_groups, max_model_len)
    return dict(groups=describe_groups(config.kv_cache_groups), num_blocks=config.num_blocks,
                block_bytes=config.block_bytes, blocks_per_request=per_request,
                requests=(config.num_blocks - 1) // per_request)


class DecodeLoop:
    """One request of `context` tokens decoding on an engine's runner, fed scheduler outputs
    by hand: block tables as the scheduler would hold them (a sliding group's before its
    window null), pages handed out in order."""

    def __init__(self, llm: LLM, context: int, max_steps: int):
        core = llm.llm_engine.engine_core
        self.runner = core.model_executor.driver_worker.model_runner
        bs = self.runner.block_size
        pages, tables = iter(range(1, 1 << 30)), []
        for manager in core.scheduler.kv_cache_manager.managers:
            skipped = manager.num_skipped_blocks(context - 1)
            tables.append([0] * skipped + [next(pages) for _ in range(-(-(context + max_steps) // bs) - skipped)])
        self.context, self.step = context, 0
        self.new = NewRequestData("r", [7] * context, [], SamplingParams(temperature=0, max_tokens=1 << 20),
                                  0, None, tuple(tables), context - 1)

    def run(self) -> float:
        if self.step == 0:
            out = SchedulerOutput([self.new], CachedRequestData(), {"r": 1}, 1, set(), set())
        else:
            cached = CachedRequestData(["r"], [tuple([] for _ in self.new.block_ids)],
                                       [self.context - 1 + self.step])
            out = SchedulerOutput([], cached, {"r": 1}, 1, set(), set())
        start = time.perf_counter()
        self.runner.execute_model(out)
        self.step += 1
        return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", type=Path, default=GGUF)
    p.add_argument("--kv-memory", type=int, default=2 << 30, help="bytes, for the capacity figure")
    p.add_argument("--capacity-len", type=int, default=32768)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=10, help="decode steps per round")
    p.add_argument("--json", type=Path)
    ns = p.parse_args()

    max_len = ns.context + ns.rounds * ns.steps + 16
    # The same KV memory for both: what the engine without groups needs for one request.
    memory = (max_len // 16 + 2) * 18 * 2 * 16 * 256 * 4
    engines = {mode: LLM(str(ns.gguf), max_model_len=max_len, max_num_seqs=1, max_num_batched_tokens=64,
                         kv_cache_memory_bytes=memory, enable_prefix_caching=False,
                         disable_hybrid_kv_cache_manager=mode == "before", skip_warmup=True)
               for mode in ("before", "after")}
    result = {"load_avg": os.getloadavg(), "kv_memory": ns.kv_memory, "capacity_len": ns.capacity_len,
              "context": ns.context, "decode_kv_memory": memory}
    for mode, llm in engines.items():
        specs = llm.llm_engine.engine_core.model_executor.driver_worker.get_kv_cache_spec()
        if mode == "before":
            specs = {name: dataclasses.replace(spec, sliding_window=None) for name, spec in specs.items()}
        result[f"capacity_{mode}"] = capacity(specs, ns.kv_memory, ns.capacity_len)
    loops = {mode: DecodeLoop(llm, ns.context, ns.rounds * ns.steps + 2) for mode, llm in engines.items()}
    for loop in loops.values():
        loop.run()  # compiles
    times = {mode: [] for mode in loops}
    for _ in range(ns.rounds):
        for mode, loop in loops.items():
            times[mode] += [loop.run() for _ in range(ns.steps)]
    for mode, t in times.items():
        result[f"decode_step_ms_{mode}"] = 1e3 * statistics.median(t)
    result["load_avg_after"] = os.getloadavg()
    before, after = result["capacity_before"], result["capacity_after"]
    print(f"Gemma 3 270M, KV memory {ns.kv_memory / 2**30:g} GiB, requests of {ns.capacity_len} tokens:")
    for mode, c in (("before", before), ("after", after)):
        print(f"  {mode:6s} {c['requests']:3d} requests ({c['num_blocks']:,} blocks of {c['block_bytes']:,} bytes; "
              f"{c['blocks_per_request']:,} per request; {c['groups']})")
    print(f"  ratio {after['requests'] / max(before['requests'], 1):.1f}x")
    print(f"decode step at {ns.context} tokens of context (median of {ns.rounds * ns.steps}, alternated rounds; "
          f"load {result['load_avg'][0]:.2f} -> {result['load_avg_after'][0]:.2f}):")
    for mode in ("before", "after"):
        print(f"  {mode:6s} {result[f'decode_step_ms_{mode}']:.1f} ms")
    if ns.json:
        ns.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
