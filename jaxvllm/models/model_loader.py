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
from jaxvllm.models.loader import load_weights
from jaxvllm.models.orbax_checkpoint import is_orbax_checkpoint, restore_params
from jaxvllm.models.registry import get_model_class

logger = logging.getLogger(__name__)


def get_model(config: EngineConfig, model_path: str, hf_config, mesh: Mesh, *,
              pad_heads: bool = True) -> nnx.Module:
    """pad_heads: pad attention heads so they split evenly over the mesh (serving); off for
    `convert`, which stores the checkpoint's own shapes."""
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
    # Abstract: no random init, and no device ever holds a whole tensor meant to be split.
    model = nnx.eval_shape(lambda: model_cls(padded, dtype=dtype))
    if is_orbax_checkpoint(model_path):
        stored = nnx.eval_shape(lambda: model_cls(args, dtype=dtype))
        _restore(model, nnx.to_pure_dict(nnx.state(stored)), model_path, mesh, dtype)
    else:
        model.load_hf_weights(load_weights(model_path), functools.partial(place, mesh))
    return model


def _restore(model: nnx.Module, stored: dict, path: str, mesh: Mesh, dtype) -> None:
    """Restore into the shardings of the stored (unpadded) shapes, then pad heads on device."""
    target = jax.tree_util.tree_map_with_path(
        lambda p, x: jax.ShapeDtypeStruct(x.shape, dtype, sharding=param_sharding(param_name(p), x.shape, mesh)),
        stored)
    restored = restore_params(path, target)
    state = nnx.state(model)
    wanted = nnx.to_pure_dict(state)

    def fit(p, x, want):
        if x.shape == want.shape:
            return x
        pad = jax.jit(lambda x: jnp.pad(x, [(0, b - a) for a, b in zip(x.shape, want.shape)]),
                      out_shardings=param_sharding(param_name(p), want.shape, mesh))
        return pad(x)

    nnx.replace_by_pure_dict(state, jax.tree_util.tree_map_with_path(fit, restored, wanted))
    nnx.update(model, state)
