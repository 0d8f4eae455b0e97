"""get_stage_models: a model split into pipeline stages, each a model of the same class
holding only its own decoder layers (renumbered from 0), placed on its own mesh.

The checkpoint is read once; each stage takes its layers' tensors. The first stage keeps
the embedding, the last the final norm and the LM head (the embedding too where the head is
tied to it); the others drop them, so no stage holds a weight it does not run.
"""
from __future__ import annotations

import dataclasses
import functools
import re

import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from jaxvllm.config import EngineConfig
from jaxvllm.distributed.partition import padded_heads, place
from jaxvllm.layers.linear import UnquantizedLinearMethod
from jaxvllm.models.loader import load_weights
from jaxvllm.models.orbax_checkpoint import is_orbax_checkpoint
from jaxvllm.models.registry import get_model_class

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)")


def get_stage_models(config: EngineConfig, model_path: str, hf_config, meshes: list[Mesh],
                     layer_ranges: list[range], linear_methods: list) -> list[nnx.Module]:
    if is_orbax_checkpoint(model_path):
        raise ValueError("pipeline_parallel_size > 1 loads GGUF or safetensors checkpoints, not "
                         "Orbax ones; serve the original checkpoint.")
    model_cls, args_cls = get_model_class(hf_config)
    if not _has_stage_parts(model_cls):
        raise ValueError(f"{model_cls.__name__} cannot be split into pipeline stages yet; use "
                         f"pipeline_parallel_size=1.")
    args = args_cls.from_hf_config(hf_config)
    dtype = jnp.dtype(config.dtype)
    weights = load_weights(model_path)
    stages = []
    for s, (mesh, layers, method) in enumerate(zip(meshes, layer_ranges, linear_methods)):
        num_heads, num_kv_heads = padded_heads(args.num_heads, args.num_kv_heads, mesh.size)
        stage_args = dataclasses.replace(args, num_layers=len(layers), num_heads=num_heads,
                                         num_kv_heads=num_kv_heads)
        method = method or UnquantizedLinearMethod()
        if not all(method.supports(i, o, dtype) for i, o in model_cls.linear_shapes(stage_args).values()):
            method = UnquantizedLinearMethod()
        model = nnx.eval_shape(lambda: model_cls(stage_args, dtype=dtype, linear_method=method))
        model.load_hf_weights(_stage_weights(weights, layers), functools.partial(place, mesh))
        first, last = s == 0, s == len(meshes) - 1
        if not first and not (last and model.lm_head is None):
            model.embed_tokens = None
        if not last:
            model.norm = None
            model.lm_head = None
        stages.append(model)
    return stages


def _has_stage_parts(model_cls) -> bool:
    """Whether the class's forward is its stage parts (embed, forward_layers, final_norm): a
    family that overrides its forward but inherits the parts would run another family's
    layers in stages."""
    def owner(name):
        return next((c for c in model_cls.__mro__ if name in vars(c)), None)
    return owner("forward_layers") is not None and all(
        owner(name) is owner("__call__") for name in ("embed", "forward_layers", "final_norm"))


def _stage_weights(weights: dict, layers: range) -> dict:
    """The checkpoint's tensors for one stage: its layers renumbered from 0, and the
    embedding, final norm and head (placed, then dropped where the stage does not run them)."""
    out = {}
    for name, value in weights.items():
        match = _LAYER.fullmatch(name)
        if match is None:
            out[name] = value
        elif int(match[1]) in layers:
            out[f"model.layers.{int(match[1]) - layers.start}.{match[2]}"] = value
    return out
