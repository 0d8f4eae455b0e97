"""Run in a subprocess by test_tensor_parallel_lifecycle.py (8 simulated CPU devices must be
set before jax is imported): sleep, wake-up and update_weights at tensor parallelism.

python lifecycle_check.py MODEL NEW_MODEL TP -> JSON on the last stdout line: greedy tokens
before and after each step, of a fresh engine on NEW_MODEL, the device memory awake and
asleep, and the programs compiled during sleep, wake-up and updates.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")

from jax import monitoring  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

from jaxvllm import LLM, SamplingParams  # noqa: E402

PROMPTS = [{"prompt_token_ids": p} for p in ([5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41])]
GREEDY = SamplingParams(temperature=0, max_tokens=8, min_tokens=8)
lowered = []
monitoring.register_event_duration_secs_listener(
    lambda event, _, **kw: lowered.append(kw.get("fun_name"))
    if event == "/jax/core/compile/jaxpr_to_mlir_module_duration" else None)


def greedy(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def main(model: str, new_model: str, tp: str) -> None:
    engine = dict(tensor_parallel_size=int(tp), skip_warmup=True, max_num_seqs=8, max_num_batched_tokens=128,
                  max_model_len=256, num_gpu_blocks_override=64)
    llm = LLM(model, **engine)
    core = llm.llm_engine.engine_core
    r = {"before": greedy(llm), "awake": core.device_memory_in_use()}
    start = len(lowered)
    llm.sleep(level=1)
    r["asleep"] = core.device_memory_in_use()
    llm.wake_up()
    r["after_wake_up"] = greedy(llm)
    llm.update_weights(load_file(os.path.join(new_model, "model.safetensors")))  # numpy, by checkpoint name
    r["updated"] = greedy(llm)
    llm.sleep(level=2)
    llm.update_weights(model)  # a path, after level 2: every weight
    llm.wake_up()
    r["restored"] = greedy(llm)
    r["compiled"] = lowered[start:]
    r["fresh"] = greedy(LLM(new_model, **engine))
    print(json.dumps(r))


if __name__ == "__main__":
    main(*sys.argv[1:])
