"""Sleep mode and weight updates on the default model (or --model): the engine's start (LLM
construction with warm-up: cold with JAXVLLM_XLA_CACHE= , else warm from the programs a
previous start saved) against the time to sleep, wake up and update the weights;
the device memory the engine holds awake, asleep at level 1 and 2, and awake again
(`device.memory_stats()` where the backend reports it, else the bytes of live arrays; the
fraction freed is of what the engine added to what the process held before it); that
greedy outputs survive sleep and a reload; and the programs compiled during all of it (none).

    [JAXVLLM_XLA_CACHE=] python benchmarks/sleep_mode.py [--model PATH] [--json PATH] [--max-model-len N]
        [--max-num-seqs N] [--max-num-batched-tokens N] [--kv-cache-memory-bytes N] [--skip-warmup]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LOWERING = "/jax/core/compile/jaxpr_to_mlir_module_duration"  # once per program compiled


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--json", default=None)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=64)
    parser.add_argument("--kv-cache-memory-bytes", type=int, default=None)
    parser.add_argument("--skip-warmup", action="store_true")
    ns = parser.parse_args(argv)
    import jax
    from jax import monitoring

    from jaxvllm import LLM, SamplingParams
    from jaxvllm.models.loader import load_weights
    from jaxvllm.worker.sleep_mode import device_memory_in_use

    lowered = []
    monitoring.register_event_duration_secs_listener(
        lambda event, _, **kw: lowered.append(kw.get("fun_name")) if event == LOWERING else None)
    held_before = device_memory_in_use(jax.local_devices())  # arrays of whoever calls this (a test session)
    start = time.perf_counter()
    llm = LLM(ns.model, max_model_len=ns.max_model_len, max_num_seqs=ns.max_num_seqs,
              max_num_batched_tokens=ns.max_num_batched_tokens, skip_warmup=ns.skip_warmup,
              kv_cache_memory_bytes=ns.kv_cache_memory_bytes)
    r = {"start_s": time.perf_counter() - start}
    prompts = [{"prompt_token_ids": [5, 6, 7, 8]}, {"prompt_token_ids": list(range(40, 60))}]  # any vocabulary
    greedy = SamplingParams(temperature=0, max_tokens=16)

    def outputs():
        return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]

    core = llm.llm_engine.engine_core
    worker = core.model_executor.driver_worker
    before = outputs()
    for thread in threading.enumerate():  # the CPU's huge-page collapse after the first step:
        if thread.name == "huge-pages":  # its page-table work slowed the host copy several-fold
            thread.join()
    checkpoint = load_weights(worker.model_path)  # what an RL trainer would send: every tensor
    memory = {"awake": core.device_memory_in_use()}
    compiled_before = len(lowered)
    for level in (1, 2):
        r[f"sleep_level{level}_s"] = timed(lambda: llm.sleep(level=level))  # noqa: B023 (called at once)
        memory[f"asleep_level{level}"] = core.device_memory_in_use()
        r[f"wake_up_level{level}_s"] = timed(llm.wake_up)  # level 2: reloads the checkpoint
        memory[f"awake_after_level{level}"] = core.device_memory_in_use()
        r[f"same_outputs_after_level{level}"] = outputs() == before
    r["update_weights_s"] = timed(lambda: llm.update_weights(checkpoint))
    r["same_outputs_after_update"] = outputs() == before
    r["compilations"] = len(lowered) - compiled_before
    r["memory_mib"] = {k: round(v / 2**20, 2) for k, v in memory.items()}
    r["memory_mib"]["before_engine"] = round(held_before / 2**20, 2)
    r["freed_fraction"] = {level: round(1 - (memory[f"asleep_level{level}"] - held_before)
                                       / (memory["awake"] - held_before), 4) for level in (1, 2)}
    print(json.dumps(r, indent=1))
    if ns.json:
        Path(ns.json).write_text(json.dumps(r, indent=1))
    return r


if __name__ == "__main__":
    main()
