"""compile_for_target (`jaxvllm compile MODEL --target tpu-v6e-8`): every program the engine
warms up, compiled by the TPU compiler (Mosaic kernels included) for a slice's compile-only
devices, on any machine, with no weights read (a directory holding only config.json will do).

It builds what the engine would build on that slice: the TPU backend's choices, tensor
parallel over its chips, the memory plan for its HBM (the KV cache gets hbm_utilization of
the chip less the weights and the largest step's temporaries, which it compiles for as the
worker profiles them), then compiles each program against abstract weights and KV cache and
reports what the compiler says: memory (arguments, temporaries, the donated KV cache as
aliased bytes), cost, and a roofline time from the chip's published figures
(jaxvllm/roofline.py: a prediction, not a measurement). A plan that does not fit is refused
naming the smallest slice that holds the weights and one request of max_model_len.
"""
from __future__ import annotations

import functools
import math
import os
import threading
import time
from typing import Callable

from jaxvllm.platforms.tpu_targets import TARGETS, Target, get_target
from jaxvllm.roofline import predict


def _per_device_bytes(tree) -> int:
    """Bytes per chip; a TPU packs two 4-bit values in a byte (numpy's itemsize says one)."""
    import jax
    import jax.numpy as jnp

    def nbytes(x) -> float:
        per_value = 0.5 if x.dtype in (jnp.int4, jnp.uint4) else x.dtype.itemsize
        return math.prod(x.sharding.shard_shape(x.shape)) * per_value
    return int(sum(nbytes(x) for x in jax.tree.leaves(tree)))


def _abstract_model(config, hf_config, mesh, backend, draft: bool = False):
    """The model as the worker holds it on this mesh once loaded (padded heads, the
    backend's matmuls, quantized weights as QArrays), every weight a ShapeDtypeStruct with
    its sharding; a draft as the worker loads one:
    unquantized, without expert parallelism."""
    import jax.numpy as jnp

    from jaxvllm.models.model_loader import build_model, model_args, shard_abstract, store_abstract
    from jaxvllm.models.registry import get_model_class

    model_cls, args_cls = get_model_class(hf_config)
    ep = config.parallel.enable_expert_parallel and not draft
    args = model_args(model_cls, args_cls.from_hf_config(hf_config), mesh.size, expert_parallel=ep)
    model = build_model(model_cls, args, dtype=jnp.dtype(config.dtype),
                        linear_method=backend.float_linear_method if draft else backend.linear_method,
                        moe_method=backend.float_moe_method if draft else backend.moe_method)
    return store_abstract(shard_abstract(model, mesh, ep))


def _program_name(runner, program, args, static) -> str:
    bucket = (f" R={int(args[3])}" if program in (runner._sample, runner._sample_extended)
              else f" T={len(args[2])}" if program.name in ("forward", "forward_lora", "prompt_logprobs",
                                                            "draft_forward")
              else f" R={args[2].shape[0]}" if program.name == "propose"
              else f" T={len(args[3])}" if program.name == "propose_eagle" else "")
    return program.name + bucket + "".join(f" {k}={v}" for k, v in static.items())


_FORWARDS = ("forward", "forward_lora")  # programs of a step's tokens through the model


def _compile_one(program, args, static, mesh, chip, roofline: Callable[[int, float], dict]) -> dict:
    """Compile one program and read what the compiler says. `roofline(tokens, xla_flops)`:
    a forward's prediction (jaxvllm/roofline.py); other programs' comes from XLA's cost
    analysis, which sees all of their work."""
    import jax
    start = time.perf_counter()
    try:
        with jax.set_mesh(mesh):
            compiled = program.jitted.lower(*args, **static).compile()
    except Exception as e:  # Mosaic's or XLA's refusal is the finding: report it, go on
        return dict(compiled=False, error=str(e).strip().splitlines()[0][:2000],
                    compile_s=round(time.perf_counter() - start, 2))
    mem, cost = compiled.memory_analysis(), compiled.cost_analysis() or {}
    if isinstance(cost, list):  # older jax: one dict per module
        cost = cost[0] if cost else {}
    flops, accessed = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
    predicted = (roofline(len(args[2]), flops) if program.name in _FORWARDS else
                 dict(predicted_s=max(accessed / chip.hbm_bytes_per_s, flops / chip.peak_flops)))
    return dict(compiled=True, error=None, compile_s=round(time.perf_counter() - start, 2),
                argument_bytes=mem.argument_size_in_bytes, output_bytes=mem.output_size_in_bytes,
                temp_bytes=mem.temp_size_in_bytes, alias_bytes=mem.alias_size_in_bytes,
                flops=flops, bytes_accessed=accessed, **predicted)


def _smallest_fit(target: Target, need_weights: int, need_kv: int, peak: int, utilization: float) -> str | None:
    """The smallest slice (same chip first, then the others) whose chips hold, split by tensor
    parallelism, the weights, one request of max_model_len and the step's temporaries."""
    order = sorted(TARGETS.values(), key=lambda t: (t.chip is not target.chip, t.num_chips * t.chip.hbm_bytes))
    for t in order:
        if (need_weights + need_kv) / t.num_chips + peak <= t.chip.hbm_bytes * utilization:
            return t.name
    return None


def compile_for_target(model: str, target: str, *, programs: tuple[str, ...] | None = None,
                       on_program: Callable[[dict], None] | None = None, context: int | None = None,
                       compile_threads: int | None = None, **engine_kwargs) -> dict:
    """The report of `jaxvllm compile` (module doc) as a dict; `programs`: compile only those
    whose names start with one of these (`forward`, `sample`, ...); `on_program`: called with
    each program's row as it is compiled; `context`: the KV each sequence reads in a forward's
    roofline (default min(2,048, max_model_len)); `compile_threads`: programs compiled at once
    (default: the TPU platform's, as its warm-up does); engine_kwargs: EngineArgs
    (tensor_parallel_size defaults to the slice's chips). Raises ValueError for an unknown
    target or a configuration that does not fit, naming what would."""
    spec = get_target(target)
    start = time.perf_counter()
    import jax
    from flax import nnx

    from jaxvllm.backends import get_backend
    from jaxvllm.config import EngineArgs
    from jaxvllm.distributed.mesh import make_mesh
    from jaxvllm.distributed.partition import kv_cache_sharding
    from jaxvllm.platforms import get_platform
    from jaxvllm.transformers_utils.config import load_hf_config
    from jaxvllm.transformers_utils.model_path import resolve_model
    from jaxvllm.worker.compiled_programs import run_on_pool
    from jaxvllm.worker.memory_profiling import MemoryProfile, peak_step_bytes, profile_num_blocks
    from jaxvllm.worker.spec_decode.spec_runner import runner_class

    path = model if os.path.isfile(os.path.join(model, "config.json")) else resolve_model(model)
    hf_config = load_hf_config(path)
    engine_kwargs.setdefault("tensor_parallel_size", spec.num_chips)
    config = EngineArgs(model=path, skip_warmup=True, **engine_kwargs).create_engine_config(hf_config, "tpu")
    backend = get_backend(config, get_platform("tpu"))
    tp = config.parallel.tensor_parallel_size
    if tp > spec.num_chips:
        raise ValueError(f"tensor_parallel_size={tp} is more than {target}'s {spec.num_chips} chips.")
    mesh = make_mesh(tp, spec.devices())
    abstract_model = _abstract_model(config, hf_config, mesh, backend)
    a = abstract_model.args
    draft = {}  # speculative decoding's draft model: its layers' KV in the same blocks, after the target's
    if config.speculative is not None and config.speculative.model is not None:  # draft_model, eagle3
        draft["draft_model"] = _abstract_model(config, load_hf_config(config.speculative.model), mesh, backend,
                                                 draft=True)
        d = draft["draft_model"].args
        if (d.num_kv_heads, d.head_dim) != (a.num_kv_heads, a.head_dim):
            raise ValueError(f"speculative_config.model has {d.num_kv_heads} KV heads of {d.head_dim}, the target "
                             f"{a.num_kv_heads} of {a.head_dim}: a draft model's KV shares the target's pages.")
    num_layers = a.num_layers + sum(m.args.num_layers for m in draft.values())
    kv_format, attend = backend.kv_dtype, backend.attention(mesh)
    bs, max_len = config.cache.block_size, config.scheduler.max_model_len
    pages_per_request = -(-max_len // bs)
    threads = compile_threads or backend.platform.compile_threads

    def runner_for(num_blocks: int):
        shape = backend.kv_cache_shape(num_layers, num_blocks, bs, a.num_kv_heads, a.head_dim)
        kv = jax.ShapeDtypeStruct(shape, kv_format.storage,
                                  sharding=kv_cache_sharding(mesh, backend.platform.kv_cache_layout))
        runner = runner_class(config)(config, abstract_model, kv, attend, mesh=mesh, backend=backend,
                                      abstract=True, **draft)
        runner.compile_threads = threads
        return runner

    weights = sum(_per_device_bytes(nnx.state(m)) for m in (abstract_model, *draft.values()))
    block_bytes = math.prod(backend.kv_cache_shape(num_layers, 1, bs, a.num_kv_heads, a.head_dim)) \
        * kv_format.storage.itemsize  # whole mesh, as the worker counts it
    utilization = config.cache.hbm_utilization
    peak = profile_blocks = None

    def refuse(num_blocks: int):
        if config.cache.num_gpu_blocks_override is not None or config.cache.kv_cache_memory_bytes is not None:
            raise ValueError(f"The KV cache set ({num_blocks} blocks of {bs} tokens) holds fewer blocks than one "
                             f"request of max_model_len={max_len} needs ({pages_per_request + 1}); raise "
                             "num_gpu_blocks_override / kv_cache_memory_bytes or lower max_model_len.")
        fit = _smallest_fit(spec, weights * tp, pages_per_request * block_bytes, peak or 0, utilization)
        halved = kv_format.storage.itemsize == 2 and _smallest_fit(
            spec, weights * tp, pages_per_request * block_bytes // 2, peak or 0, utilization) == target
        raise ValueError(
            f"{config.model.name} does not fit {target} at tensor_parallel_size={tp}: {weights / 2**30:.2f} GiB of "
            f"weights per chip leave {num_blocks} KV blocks of {bs} tokens in {spec.chip.hbm_bytes / 2**30:g} GiB "
            f"x {utilization}, fewer than one request of max_model_len={max_len} needs "
            f"({pages_per_request + 1}). " + (f"The smallest slice that fits: {fit} (tensor_parallel_size="
                                              f"{TARGETS[fit].num_chips}); or lower max_model_len" if fit else
                                              "No known slice fits; lower max_model_len or quantize")
            + ("; or kv_cache_dtype='fp8', which halves the KV: the weights and one request would then fit this "
               "slice" + (" (before the step's own memory, not yet compiled)." if peak is None else ".")
               if halved else "."))

    if (weights + pages_per_request * block_bytes / tp) > spec.chip.hbm_bytes * utilization:
        # before compiling anything: not even the weights and one request fit
        refuse(max(int(spec.chip.hbm_bytes * utilization) - weights, 0) * tp // block_bytes)
    if config.cache.num_gpu_blocks_override is not None:
        num_blocks = config.cache.num_gpu_blocks_override
    elif config.cache.kv_cache_memory_bytes is not None:
        num_blocks = config.cache.kv_cache_memory_bytes // block_bytes
    else:
        profile_blocks = profile_num_blocks(backend.platform, pages_per_request, block_bytes // tp,
                                            int(spec.chip.hbm_bytes * utilization) - weights)
        peak = peak_step_bytes(runner_for(profile_blocks), mesh)
        budget = MemoryProfile(spec.chip.hbm_bytes, weights, peak).kv_cache_budget(utilization, tp)
        num_blocks = max(budget // block_bytes, 0)
    max_concurrency = max(num_blocks - 1, 0) // pages_per_request
    if max_concurrency < 1:
        refuse(num_blocks)

    runner = runner_for(num_blocks)
    context = min(context or 2048, max_len)
    experts = sum(_per_device_bytes(v) for path, v in nnx.state(abstract_model).flat_state()
                  if any(str(k).startswith("experts_") for k in path))

    def roofline(tokens: int, xla_flops: float) -> dict:
        # A step of `tokens` in min(tokens, max_num_seqs) sequences, each reading `context`.
        return predict(a, spec.chip, xla_flops=xla_flops, tokens=tokens,
                       seqs=min(tokens, config.scheduler.max_num_seqs), context=context,
                       weight_bytes=weights, expert_bytes=experts,
                       kv_bytes_per_token_layer=block_bytes / (num_layers * bs * tp),
                       dtype_bytes=jax.numpy.dtype(config.dtype).itemsize, tp=tp)

    reported = threading.Lock()

    def compile_row(name, program, args, static) -> dict:
        row = dict(program=name, **_compile_one(program, args, static, mesh, spec.chip, roofline))
        if on_program:
            with reported:
                on_program(row)
        return row

    jobs = []
    for program, args, static in runner.warmup_jobs():
        name = _program_name(runner, program, args, static)
        if not programs or name.startswith(tuple(programs)):
            jobs.append(functools.partial(compile_row, name, program, args, static))
    compile_start = time.perf_counter()
    rows = run_on_pool(jobs, threads)
    compile_wall = time.perf_counter() - compile_start
    kv_bytes = _per_device_bytes(runner.kv_cache)
    fits = all(r["compiled"] and r["argument_bytes"] + r["output_bytes"] - r["alias_bytes"] + r["temp_bytes"]
               <= spec.chip.hbm_bytes for r in rows)
    return dict(target=target, model=config.model.name, chips=spec.num_chips, tensor_parallel_size=tp,
                device_kind=spec.chip.device_kind, attention_backend=config.model.attention_backend,
                dtype=config.dtype, kv_cache_dtype=config.cache.kv_cache_dtype, quantization=config.quantization,
                block_size=bs, max_model_len=max_len, max_num_seqs=config.scheduler.max_num_seqs,
                max_num_batched_tokens=config.scheduler.max_num_batched_tokens, roofline_context=context,
                fits=fits, hbm_bytes=spec.chip.hbm_bytes,
                weights_bytes=weights, kv_blocks=num_blocks, kv_cache_bytes=kv_bytes, peak_step_bytes=peak,
                profile_kv_blocks=profile_blocks,
                max_concurrency=max_concurrency, compile_threads=threads,
                compile_s=round(sum(r["compile_s"] for r in rows), 2), compile_wall_s=round(compile_wall, 1),
                wall_s=round(time.perf_counter() - start, 1), programs=rows)
