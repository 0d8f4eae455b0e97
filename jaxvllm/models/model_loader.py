"""get_model: the model for an engine, built abstractly and filled straight into its
shards on the mesh, from a GGUF / safetensors checkpoint or an Orbax checkpoint."""
from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jaxvllm.config import EngineConfig
from jaxvllm.distributed.partition import param_name, padded_heads, param_sharding, place
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.models.loader import load_weights
from jaxvllm.models.orbax_checkpoint import is_orbax_checkpoint, restore_params
from jaxvllm.models.registry import get_model_class

logger = logging.getLogger(__name__)


def get_model(config: EngineConfig, model_path: str, hf_config, mesh: Mesh, *,
              pad_heads: bool = True, linear_method=None, moe_method=None,
              weights: dict | None = None, layers: range | None = None) -> nnx.Module:
    """pad_heads: pad attention heads so they split evenly over the mesh (serving); off for
    `convert`, which stores the checkpoint's own shapes. linear_method: the platform's
    (jaxvllm/layers/linear.py; default XLA's), kept for the whole model: where it cannot take
    every matmul weight of this model, XLA's runs them all. moe_method: the platform's, for
    mixture-of-experts models (layers/fused_moe.py). weights: the checkpoint's tensors if the
    caller has read them (load_weights), else read here. layers: a pipeline stage's decoder
    layers (models/stage_loader.py), whose weights come renumbered from 0."""
    model_cls, args_cls = get_model_class(hf_config)
    args = args_cls.from_hf_config(hf_config)
    dtype = jnp.dtype(config.dtype)
    padded = args
    if pad_heads:
        num_heads, num_kv_heads = padded_heads(args.num_heads, args.num_kv_heads, mesh.size)
        if num_kv_heads != args.num_kv_heads:
            logger.info("Attention heads padded from %d/%d to %d/%d (query/KV) for "
                        "tensor_parallel_size=%d.", args.num_heads, args.num_kv_heads, num_heads,
                        num_kv_heads, mesh.size)
        padded = dataclasses.replace(args, num_heads=num_heads, num_kv_heads=num_kv_heads)
    expert_parallel = config.parallel.enable_expert_parallel
    moe = {}
    if hasattr(args, "num_experts"):
        padded = dataclasses.replace(padded, expert_parallel=expert_parallel)
        moe = dict(moe_method=moe_method)
    elif expert_parallel:
        raise ValueError(f"enable_expert_parallel: {hf_config.architectures} has no experts.")
    if layers is not None:
        padded = padded.for_layers(layers)
    method = linear_method or UnquantizedLinearMethod()
    if not all(method.supports(i, o, dtype) for i, o in model_cls.linear_shapes(padded).values()):
        logger.info("%s cannot take every matmul weight of this model; XLA runs them.", type(method).__name__)
        method = UnquantizedLinearMethod()
    # Abstract: no random init, and no device ever holds a whole tensor meant to be split.
    model = nnx.eval_shape(lambda: model_cls(padded, dtype=dtype, linear_method=method, **moe))
    if is_orbax_checkpoint(model_path):
        model.load_weights(restore_orbax(hf_config, padded, model_path, mesh, dtype, expert_parallel))
    else:
        model.load_hf_weights(load_weights(model_path) if weights is None else weights,
                              functools.partial(place, mesh, expert_parallel=expert_parallel))
    return model


def restore_orbax(hf_config, padded_args, path: str, mesh: Mesh, dtype, expert_parallel: bool = False):
    """(name, array) of an Orbax checkpoint's weights on the mesh, heads padded to padded_args."""
    model_cls, args_cls = get_model_class(hf_config)
    stored = nnx.eval_shape(lambda: model_cls(args_cls.from_hf_config(hf_config), dtype=dtype))
    wanted = nnx.eval_shape(lambda: model_cls(padded_args, dtype=dtype))
    return _restore(stored, wanted, path, mesh, dtype, expert_parallel)


def _restore(stored: nnx.Module, wanted: nnx.Module, path: str, mesh: Mesh, dtype,
             expert_parallel: bool = False):
    """(name, array) of each weight as loaded: restored into the shardings of the stored
    (unpadded) shapes, then its heads padded on device to the wanted shapes."""
    target = jax.tree_util.tree_map_with_path(
        lambda p, x: jax.ShapeDtypeStruct(x.shape, dtype, sharding=param_sharding(param_name(p), x.shape, mesh,
                                                                        expert_parallel)),
        nnx.to_pure_dict(nnx.state(stored)))
    restored = jax.tree_util.tree_flatten_with_path(restore_params(path, target))[0]
    shapes = jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(nnx.state(wanted)))[0]
    for (p, x), (_, want) in zip(restored, shapes):
        name = param_name(p)
        if x.shape != want.shape:
            pad = jax.jit(lambda x, shape=want.shape: jnp.pad(x, [(0, b - a) for a, b in zip(x.shape, shape)]),
                          out_shardings=param_sharding(name, want.shape, mesh, expert_parallel))
            x = pad(x)
        yield name, x
