"""The engine's own step lowered for a TPU or an NVIDIA GPU on any machine (no device needed),
and what its StableHLO says about how it will run there.

The programs are ModelRunner's (the functions it compiles at warm-up), built with the target
platform's backend and defaults: attention kernel, layer loop, sampler variants, dtype and
block size.
Weights and KV cache are `jax.ShapeDtypeStruct`s, so Llama-3-8B shapes allocate nothing
large. A step for a GPU or TPU should hold no conditional (`stablehlo.case`: XLA:GPU waits on
the host for its predicate) and no loop (`stablehlo.while`), run one attention kernel per
layer, and update the KV cache in place (donated: `tf.aliasing_output` on its argument).
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractDevice, AbstractMesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jaxvllm.backends import get_backend  # noqa: E402
from jaxvllm.config import EngineArgs  # noqa: E402
from jaxvllm.distributed.mesh import MODEL_AXIS, make_mesh  # noqa: E402
from jaxvllm.distributed.partition import kv_cache_sharding, padded_heads  # noqa: E402
from jaxvllm.models.eagle3 import Eagle3Args, Eagle3LlamaForCausalLM  # noqa: E402
from jaxvllm.models.llama import LlamaArgs, LlamaForCausalLM  # noqa: E402
from jaxvllm.models.model_loader import shard_abstract  # noqa: E402
from jaxvllm.platforms import get_platform  # noqa: E402
from jaxvllm.worker.spec_decode.spec_runner import runner_class  # noqa: E402

# The custom call each Pallas kernel lowers to (the kernel travels inside it as MLIR).
KERNEL_TARGETS = {"tpu": "tpu_custom_call", "cuda": "__gpu$xla.gpu.triton"}
TPU_KIND = "TPU v5 lite"  # the chip generation the Mosaic lowering tiles for
NUM_BLOCKS = 4096
TOKENS = REQUESTS = 64  # the buckets lowered: a decode step of 64 sequences
SAMPLERS = ("sample", "sample_extended", "verify")  # verify: speculative decoding's
FORWARDS = ("forward", "forward_lora")  # forward_lora: with enable_lora, steps with adapters
DRAFTS = ("draft_forward", "propose", "propose_eagle")  # speculative decoding's draft model or EAGLE-3 head


def step_runner(platform_name: str, args: LlamaArgs, tensor_parallel_size: int = 1,
                model_cls=LlamaForCausalLM, num_blocks: int = NUM_BLOCKS, draft_layers: int = 0,
                eagle3: bool = False, **engine_args):
    """(ModelRunner, KV cache, chip context) of the engine's step for `platform_name`, its
    weights and KV cache `jax.ShapeDtypeStruct`s. Tensor parallel over that many of this
    machine's devices, which stand in for the accelerators (on a CPU:
    --xla_force_host_platform_device_count). model_cls: the family whose args these are
    (models/registry.py); a mixture-of-experts class gets the backend's grouped matmul.
    The chip context is where a TPU step must be traced (Mosaic asks which chip it tiles for).
    draft_layers: speculative decoding's method draft_model, the draft the target's first
    draft_layers layers (its speculative_config's num_speculative_tokens kept), its KV in the
    same cache after the target's layers. eagle3: method eagle3, an EAGLE-3 head of the
    target's shapes (a draft vocabulary half the target's)."""
    # max_num_seqs: the batch lowered (the penalty rows ModelRunner allocates grow with it).
    engine_args = dict(dict(max_num_seqs=REQUESTS), **engine_args)
    config = EngineArgs(num_gpu_blocks_override=num_blocks, skip_warmup=True, **engine_args).create_engine_config(
        types.SimpleNamespace(max_position_embeddings=args.max_position_embeddings), platform_name)
    if draft_layers or eagle3:  # no checkpoint to resolve: the draft is abstract like the target
        config = dataclasses.replace(config, speculative=dataclasses.replace(
            config.speculative, method="eagle3" if eagle3 else "draft_model", model="(abstract)"))
    dtype = jnp.dtype(config.dtype)
    backend = get_backend(config, get_platform(platform_name))
    mesh = make_mesh(tensor_parallel_size)
    num_heads, num_kv_heads = padded_heads(args.num_heads, args.num_kv_heads, tensor_parallel_size)
    args = dataclasses.replace(args, num_heads=num_heads, num_kv_heads=num_kv_heads)
    moe_method = backend.float_moe_method  # the weights here are float, as lowered
    model = shard_abstract(nnx.eval_shape(lambda: model_cls(args, dtype=dtype, moe_method=moe_method)), mesh)
    draft = ({"draft_model": shard_abstract(nnx.eval_shape(lambda: model_cls(
        dataclasses.replace(args, num_layers=draft_layers), dtype=dtype, moe_method=moe_method)),
        mesh)} if draft_layers else {})
    if eagle3:
        head = Eagle3Args(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LlamaArgs)},
                          draft_vocab_size=args.vocab_size // 2, target_hidden_size=args.hidden_size)
        draft = {"draft_model": shard_abstract(nnx.eval_shape(lambda: Eagle3LlamaForCausalLM(
            dataclasses.replace(head, num_layers=1), dtype=dtype)), mesh)}
        draft_layers = 1
    kv_cache = jax.ShapeDtypeStruct(
        backend.kv_cache_shape(args.num_layers + draft_layers, num_blocks, config.cache.block_size, args.num_kv_heads,
                               args.head_dim), backend.kv_dtype.storage,
        sharding=kv_cache_sharding(mesh, backend.platform.kv_cache_layout))
    chip = contextlib.nullcontext()
    abstract_mesh = None
    if platform_name == "tpu":  # the Mosaic lowering asks which chip it tiles for
        device = AbstractDevice(device_kind=TPU_KIND, num_cores=1, platform="tpu")
        abstract_mesh = AbstractMesh((tensor_parallel_size,), (MODEL_AXIS,), abstract_device=device)
        chip = jax.sharding.use_abstract_mesh(abstract_mesh)
    runner = runner_class(config)(config, model, kv_cache, backend.attention(abstract_mesh or mesh), mesh=mesh,
                                  backend=backend, abstract_mesh=abstract_mesh, **draft)
    return runner, kv_cache, chip


def lower_step(platform_name: str, args: LlamaArgs, tensor_parallel_size: int = 1,
               model_cls=LlamaForCausalLM, programs=("forward",) + SAMPLERS,
               **engine_args) -> tuple[dict[str, str], jax.ShapeDtypeStruct]:
    """{program: StableHLO text} of the forward for TOKENS tokens and of every sampler
    variant for REQUESTS rows (those of `programs`), lowered for `platform_name` (`tpu` or
    `cuda`); and the KV cache's abstract array (step_runner's). engine_args: more of
    EngineArgs (speculative_config: the forward and `verify` of speculative decoding;
    enable_lora=True: also `forward_lora`, the step with its adapters)."""
    runner, kv_cache, chip = step_runner(platform_name, args, tensor_parallel_size, model_cls, **engine_args)
    texts = {}
    for program, job_args, static in runner.warmup_jobs():
        if program.name not in programs:
            continue
        if program.name in FORWARDS + DRAFTS[:1] and job_args[2].shape[0] == TOKENS or (
                program.name in SAMPLERS and job_args[2].temperature.shape[0] == REQUESTS) or (
                program.name == "propose" and job_args[2].shape[0] == REQUESTS) or (
                program.name == "propose_eagle" and job_args[3].shape[0] == TOKENS):
            name = program.name + "".join(f" {k}={v}" for k, v in static.items())
            if program.name == "verify" and job_args[7] is not None:
                name += " extended"  # penalty rows, logprobs, structured output's masks
            with chip:
                texts[name] = program.jitted.trace(*job_args, **static).lower(
                    lowering_platforms=(platform_name,)).as_text()
    return texts, kv_cache


def kernel_calls(text: str, target: str) -> int:
    """How many times one run of the module's main function calls custom call `target`,
    through the private functions it calls (jax outlines a jitted kernel wrapper once and
    calls it per layer)."""
    bodies = dict(re.findall(r"func\.func \w+ @([\w$.]+)\((.*?)(?=\n  func\.func |\Z)", text, re.S))
    memo: dict[str, int] = {}

    def count(name: str) -> int:
        if name not in memo:
            body = bodies[name]
            memo[name] = body.count(f"stablehlo.custom_call @{target}(") + sum(
                count(callee) for callee in re.findall(r"(?<!custom_)call @([\w$.]+)\(", body))
        return memo[name]
    return count("main")


def donated(text: str, array: jax.ShapeDtypeStruct) -> bool:
    """Whether main's arguments of `array`'s shape alias an output (are updated in place)."""
    shape = "tensor<" + "x".join(map(str, array.shape)) + "x"
    signature = re.search(r"func\.func public @main\((.*?)\) ->", text, re.S).group(1)
    arguments = [a for a in re.split(r"%arg\d+: ", signature) if a.startswith(shape)]
    return bool(arguments) and all("tf.aliasing_output" in a for a in arguments)


def program_rows(platform_name: str, texts: dict[str, str], kv_cache) -> list[dict]:
    """One row per program: conditionals, loops, attention kernel calls, KV cache donated."""
    target = KERNEL_TARGETS[platform_name]
    return [dict(program=name, case=text.count("stablehlo.case"), loops=text.count("stablehlo.while"),
                 kernels=kernel_calls(text, target),
                 kv_donated=donated(text, kv_cache) if name in FORWARDS + DRAFTS else None)
            for name, text in texts.items()]
