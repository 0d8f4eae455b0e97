"""get_model: the model for an engine, built abstractly and filled straight into its
shards on the mesh, from a GGUF / safetensors checkpoint or an Orbax checkpoint."""
from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from jaxvllm.distributed.partition import fit_spec, padded_heads, param_name, param_sharding, place
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.layers.quantization.config import QuantizationConfig
from jaxvllm.models.loader import load_weights
from jaxvllm.models.registry import get_model_class
from jaxvllm.models.weight_spec import EXPERTS, LINEAR
from jaxvllm.transformers_utils.orbax_checkpoint import is_orbax_checkpoint, restore_params

logger = logging.getLogger(__name__)


def model_args(model_cls, args, mesh_size: int, *, pad_heads: bool = True, expert_parallel: bool = False,
               layers: range | None = None):
    """The args a model on a mesh of mesh_size devices is built with: attention heads padded
    to split evenly (serving; off for `convert`, which keeps the checkpoint's shapes),
    experts split whole per device under expert parallelism, a pipeline stage's layers."""
    if pad_heads:
        num_heads, num_kv_heads = padded_heads(args.num_heads, args.num_kv_heads, mesh_size)
        if num_kv_heads != args.num_kv_heads:
            logger.info("Attention heads padded from %d/%d to %d/%d (query/KV) for "
                        "tensor_parallel_size=%d.", args.num_heads, args.num_kv_heads, num_heads,
                        num_kv_heads, mesh_size)
        args = dataclasses.replace(args, num_heads=num_heads, num_kv_heads=num_kv_heads)
    if any(w.kind == EXPERTS for w in model_cls.weight_spec(args)):
        args = dataclasses.replace(args, expert_parallel=expert_parallel)
    elif expert_parallel:
        raise ValueError(f"enable_expert_parallel: {model_cls.__name__} has no experts.")
    return args if layers is None else args.for_layers(layers)


def build_model(model_cls, args, *, dtype, linear_method=None, moe_method=None, first_layer: int = 0):
    """The model, abstract (no device holds a weight yet). Where linear_method cannot take
    every matmul weight of this model, XLA's runs them all."""
    quant = QuantizationConfig(linear_method, moe_method)
    linears = [w for w in model_cls.weight_spec(args) if w.kind == LINEAR]
    if not all(quant.linear_method.supports(w.shape[0], w.shape[1:], dtype) for w in linears):
        logger.info("%s cannot take every matmul weight of this model; XLA runs them.",
                    type(quant.linear_method).__name__)
        quant = QuantizationConfig(UnquantizedLinearMethod(), moe_method)
    return nnx.eval_shape(lambda: model_cls(args, dtype=dtype, quant_config=quant, first_layer=first_layer))


def shard_abstract(model: nnx.Module, mesh: Mesh, expert_parallel: bool = False) -> nnx.Module:
    """The abstract model's weights as ShapeDtypeStructs with their shardings (what
    ahead-of-time compiling and lowering take)."""
    spec = model.weights()
    nnx.update(model, jax.tree_util.tree_map_with_path(lambda path, x: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=param_sharding(spec[param_name(path)], x.shape, mesh, expert_parallel)),
        nnx.state(model)))
    return model


def store_abstract(model: nnx.Module) -> nnx.Module:
    """The sharded abstract model's weights as their methods keep them once loaded: a QArray
    (values, scales, zero points) where quantization runs, each part sharded as its weight
    (a scale's input axis split as the weight's where it has several groups). Compiling ahead of time
    takes what the worker holds after loading, not the checkpoint's floats."""
    for path in model.weights():
        method = model.quant_method(path)
        if method is None or (not path.startswith("layers.") and getattr(model, path) is None):
            continue  # not a matmul weight, or a tied head read from the embedding
        param = model._param(path)
        weight = param.get_value()
        stored = method.stored_form(weight)
        param.set_value(jax.tree.map(lambda x, w=weight: jax.ShapeDtypeStruct(
            x.shape, x.dtype, sharding=_part_sharding(w, x.shape)), stored))
    return model


def _part_sharding(weight: jax.ShapeDtypeStruct, shape: tuple[int, ...]) -> NamedSharding:
    spec = tuple(weight.sharding.spec) + (None,) * (weight.ndim - len(weight.sharding.spec))
    if len(shape) != weight.ndim:
        raise ValueError(f"A stored weight part of shape {shape} has no axis map to its weight's {weight.shape}.")
    # As `place` splits them: an axis the weight splits, where the part's size divides too.
    return NamedSharding(weight.sharding.mesh, fit_spec(spec, shape, weight.sharding.mesh))


def get_model(model_path: str, hf_config, mesh: Mesh, *, dtype: str, expert_parallel: bool = False,
              pad_heads: bool = True, linear_method=None, moe_method=None,
              weights: dict | None = None, layers: range | None = None) -> nnx.Module:
    """dtype: the engine's; expert_parallel: experts whole per device (enable_expert_parallel);
    linear_method / moe_method: the backend's for the engine's quantization
    (jaxvllm/layers/linear.py, layers/fused_moe.py; default XLA's). weights: the checkpoint's
    tensors if the caller has read them (load_weights), else read here. layers: a pipeline
    stage's decoder layers (models/stage_loader.py)."""
    model_cls, args_cls = get_model_class(hf_config)
    ep = expert_parallel
    args = model_args(model_cls, args_cls.from_hf_config(hf_config), mesh.size, pad_heads=pad_heads,
                      expert_parallel=ep, layers=layers)
    model = build_model(model_cls, args, dtype=jnp.dtype(dtype), linear_method=linear_method,
                        moe_method=moe_method, first_layer=0 if layers is None else layers.start)
    if is_orbax_checkpoint(model_path):
        model.load_weights(restore_orbax(hf_config, args, model_path, mesh, jnp.dtype(dtype), ep))
    else:
        spec = model.weights()
        model.load_hf_weights(load_weights(model_path) if weights is None else weights,
                              lambda path, value: place(mesh, spec[path], value, ep))
    return model


def restore_orbax(hf_config, padded_args, path: str, mesh: Mesh, dtype, expert_parallel: bool = False):
    """(name, array) of an Orbax checkpoint's weights on the mesh, heads padded to padded_args:
    restored into the shardings of the stored (unpadded) shapes, then padded on device."""
    model_cls, args_cls = get_model_class(hf_config)
    stored = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config), dtype=dtype))
    wanted = nnx.eval_shape(lambda: model_cls(padded_args, dtype=dtype))
    spec = wanted.weights()
    target = jax.tree_util.tree_map_with_path(
        lambda p, x: jax.ShapeDtypeStruct(x.shape, dtype, sharding=param_sharding(
            spec[param_name(p)], x.shape, mesh, expert_parallel)), nnx.to_pure_dict(nnx.state(stored)))
    restored = jax.tree_util.tree_flatten_with_path(restore_params(path, target))[0]
    shapes = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(wanted)))[0]
    for (p, x), (_, want) in zip(restored, shapes):
        name = param_name(p)
        if x.shape != want.shape:
            sharding = param_sharding(spec[name], want.shape, mesh, expert_parallel)
            x = jax.jit(lambda x, shape=want.shape: jnp.pad(x, [(0, b - a) for a, b in zip(x.shape, shape)]),
                        out_shardings=sharding)(x)
        yield name, x
