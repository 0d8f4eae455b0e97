"""get_stage_models: a model split into pipeline stages, each a model of the same class
holding only its own decoder layers (renumbered from 0), placed on its own mesh.

The checkpoint is read once; each stage takes its layers' tensors. The first stage keeps
the embedding, the last the final norm and the LM head (the embedding too where the head is
tied to it); the others drop them, so no stage holds a weight it does not run.
"""
from __future__ import annotations

import re

from flax import nnx
from jax.sharding import Mesh

from jaxvllm.config import EngineConfig
from jaxvllm.models.loader import load_weights
from jaxvllm.models.model_loader import get_model
from jaxvllm.models.orbax_checkpoint import is_orbax_checkpoint
from jaxvllm.models.registry import get_model_class

_LAYER = re.compile(r"model\.layers\.(\d+)\.(.*)")


def get_stage_models(config: EngineConfig, model_path: str, hf_config, meshes: list[Mesh],
                     layer_ranges: list[range], linear_methods: list, moe_method=None) -> list[nnx.Module]:
    if is_orbax_checkpoint(model_path):
        raise ValueError("pipeline_parallel_size > 1 loads GGUF or safetensors checkpoints, not "
                         "Orbax ones; serve the original checkpoint.")
    model_cls, _ = get_model_class(hf_config)
    if not _has_stage_parts(model_cls):
        raise ValueError(f"{model_cls.__name__} cannot be split into pipeline stages yet; use "
                         f"pipeline_parallel_size=1.")
    weights = load_weights(model_path)
    stages = []
    for s, (mesh, layers, method) in enumerate(zip(meshes, layer_ranges, linear_methods)):
        model = get_model(config, model_path, hf_config, mesh, linear_method=method, moe_method=moe_method,
                          weights=_stage_weights(weights, layers), layers=layers)
        first, last = s == 0, s == len(meshes) - 1
        if not first and not (last and model.lm_head is None):
            model.embed_tokens = None
        if not last:
            model.norm = None
            model.lm_head = None
        stages.append(model)
    return stages


def _has_stage_parts(model_cls) -> bool:
    """Whether the class's forward is made of its stage parts (embed, forward_layers,
    final_norm): each part is defined where the forward is, or below it. A family that
    overrode the forward itself would run in stages another family's parts."""
    def owner(name):
        return next((c for c in model_cls.__mro__ if name in vars(c)), None)
    forward = owner("__call__")
    return all(owner(name) is not None and issubclass(owner(name), forward)
               for name in ("embed", "forward_layers", "final_norm"))


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
