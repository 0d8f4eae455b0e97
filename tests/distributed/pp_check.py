"""Run in a subprocess by the pipeline-parallel tests (the device count is fixed when jax
is imported; the rest of the suite runs on one device).

python pp_check.py MODEL|default PPxTP[w][,...] PROMPTS_JSON MAX_TOKENS [BLOCKS] -> JSON on the
last stdout line: per layout, the greedy tokens (plain, and but for the default model, whose test
compares plain ones only, with penalties and logprobs), and per stage its KV cache's per-device
shard shapes and which of embedding / final norm / head it holds.
A layout ending in "w" is warmed up and checked for recompilation.

With BLOCKS (a KV pool that small that long requests preempt each other), also per layout: the
greedy tokens of longer requests, the preemptions they cost, the tokens of the requests left
when two are aborted while batches are in flight, the free blocks after each, and the most
batches the engine had in flight at once.
"""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ.setdefault("JAXVLLM_XLA_CACHE", "")


from jaxvllm import LLM, SamplingParams  # noqa: E402


def pressure(llm, n: int) -> dict:
    """Requests that outgrow the KV pool, then four of which two are aborted mid-flight."""
    engine = llm.llm_engine
    core = engine.engine_core
    scheduler, pool = core.scheduler, core.scheduler.kv_cache_manager.block_pool
    prompts = [list(range(10 + 20 * i, 30 + 20 * i)) for i in range(4)]
    greedy = SamplingParams(temperature=0, max_tokens=n, min_tokens=n)
    before = scheduler.num_preemptions
    tokens = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)]
    result = {"long": tokens, "preemptions": scheduler.num_preemptions - before,
              "free_after_long": pool.get_num_free_blocks()}
    for i, p in enumerate(prompts):
        engine.add_request(f"a{i}", {"prompt_token_ids": p}, greedy)
    done = {}
    for step in range(10**4):
        if step == 2:  # the pipeline holds a batch: abort one request in it and one not
            in_flight_at_abort = sorted(scheduler.in_flight.req_ids if scheduler.in_flight else ())
            engine.abort_request(["a1", "a3"])
        elif not engine.has_unfinished_requests():
            break
        done.update((o.request_id, o.outputs[0].token_ids) for o in engine.step() if o.finished)
    result.update(kept=[done.get("a0"), done.get("a2")], aborted=sorted(set(done) & {"a1", "a3"}),
                  in_flight_at_abort=in_flight_at_abort, free_after_abort=pool.get_num_free_blocks(),
                  total_blocks=pool.num_blocks - 1,
                  max_in_flight=core.batch_queue.max_in_flight if core.batch_queue is not None else 1)
    return result


def main(model: str, layouts: str, prompts: str, max_tokens: str, blocks: str = "64") -> None:
    prompts = [{"prompt_token_ids": p} for p in json.loads(prompts)]
    n = int(max_tokens)
    greedy = SamplingParams(temperature=0, max_tokens=n, min_tokens=n)
    extended = SamplingParams(temperature=0, max_tokens=n, min_tokens=n, repetition_penalty=1.3, logprobs=2)
    result = {}
    for layout in layouts.split(","):
        warmup = layout.endswith("w")
        pp, tp = map(int, layout.removesuffix("w").split("x"))
        llm = LLM(None if model == "default" else model, pipeline_parallel_size=pp,
                  tensor_parallel_size=tp, skip_warmup=not warmup, check_recompilation=warmup,
                  max_num_seqs=4, max_num_batched_tokens=32, max_model_len=128,
                  num_gpu_blocks_override=int(blocks))
        worker = llm.llm_engine.engine_core.model_executor.driver_worker
        result[layout] = {
            "tokens": [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)],
            "extended": [[o.outputs[0].token_ids, o.outputs[0].cumulative_logprob]
                         for o in llm.generate(prompts, extended, use_tqdm=False)] if model != "default" else []}
        caches = worker.model_runner.kv_cache  # the step's (the one before was donated)
        result[layout].update({
            "kv_shards": [[list(s.data.shape) for s in c.addressable_shards]
                          for c in (caches if isinstance(caches, tuple) else [caches])],
            "holds": [[name for name in ("embed_tokens", "norm", "lm_head") if getattr(m, name) is not None]
                      for m in getattr(worker, "stages", [worker.model])]})
        if blocks != "64":
            result[layout].update(pressure(llm, 2 * n))
        del llm, worker, caches
    print(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
